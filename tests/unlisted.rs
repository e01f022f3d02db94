//! For the "every test file is listed" test of each crate's `tests/all.rs` (the actors crate
//! includes this file by path).

/// The `.rs` files in `dir` (other than `all.rs`) that `all_rs`, the text of `tests/all.rs`,
/// does not declare as a module.
pub fn unlisted(dir: &str, all_rs: &str) -> Vec<String> {
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the tests directory") {
        let path = entry.expect("read a directory entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs")
            && stem != "all"
            && !all_rs.contains(&format!("mod {stem};"))
        {
            missing.push(stem.to_owned());
        }
    }
    missing
}
