//! Files that hold secrets: the edge's database (every Secret delivered to the node), the
//! embedded cluster's file (every Secret of the cluster), the edge.yaml `join` writes (the join
//! token). They are readable and writable by their owner only (0600), in folders the process
//! creates for them 0700. SQLite creates its `-wal`, `-shm` and `-journal` files with the mode
//! of the database file, so a 0600 database keeps them 0600 too.
//!
//! A file (or one of SQLite's files beside it) that others may read is tightened when the
//! process starts, with a warning naming it: an operator upgrading from a version that left
//! them 0644 gets them fixed, and sees that it happened.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Mode of a file holding secrets.
pub(crate) const FILE_MODE: u32 = 0o600;
/// Mode of a folder the process creates for such files.
pub(crate) const DIR_MODE: u32 = 0o700;

/// The files SQLite keeps beside a database at `path`.
pub(crate) fn sqlite_companions(path: &Path) -> [PathBuf; 3] {
    ["-wal", "-shm", "-journal"].map(|suffix| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    })
}

/// Creates `dir` and any missing parent with mode 0700; folders that exist are left as they are
/// (they may be shared, `/var/lib` say).
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

/// Makes `path` a private file before anything writes to it: its folder is created 0700 when
/// missing, the file is created empty with mode 0600 when missing (an empty file is a valid
/// SQLite database), and an existing one, or SQLite's files beside it, that others may read
/// are tightened to 0600 with a warning. Returns the files tightened.
pub(crate) fn prepare_private_file(path: &Path) -> io::Result<Vec<PathBuf>> {
    if let Some(parent) = path.parent() {
        create_private_dir(parent)?;
    }
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
    {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    let mut tightened = Vec::new();
    for file in std::iter::once(path.to_owned()).chain(sqlite_companions(path)) {
        if tighten(&file)? {
            tightened.push(file);
        }
    }
    Ok(tightened)
}

/// Sets `path` to 0600 when others (group or world) may read or write it, logging a warning
/// that names it. `Ok(false)`: already private, or no such file.
pub fn tighten(path: &Path) -> io::Result<bool> {
    let mode = match fs::metadata(path) {
        Ok(metadata) => metadata.permissions().mode(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    if mode & 0o077 == 0 {
        return Ok(false);
    }
    fs::set_permissions(path, fs::Permissions::from_mode(FILE_MODE))?;
    tracing::warn!(
        file = %path.display(),
        was = %format!("{:04o}", mode & 0o7777),
        now = %format!("{FILE_MODE:04o}"),
        "file holding secrets was readable by other users; permissions tightened"
    );
    Ok(true)
}

/// Writes `contents` to `path` with mode 0600 from the start (never readable by others, even
/// briefly), replacing it atomically; its folder is created 0700 when missing.
pub fn write_private_file(path: &Path, contents: &[u8]) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        create_private_dir(parent)?;
    }
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(".tmp{}", std::process::id()));
    let temp = PathBuf::from(temp);
    let _ = fs::remove_file(&temp);
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&temp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_new_file_is_0600_in_new_0700_folders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/store.db");
        assert!(prepare_private_file(&path).unwrap().is_empty());
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("a/b")), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        // A folder that existed is not changed.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        prepare_private_file(&dir.path().join("other.db")).unwrap();
        assert_eq!(mode(dir.path()), 0o755);
    }

    #[test]
    fn loose_files_and_their_sqlite_companions_are_tightened_every_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        for _ in 0..2 {
            for file in std::iter::once(path.clone()).chain(sqlite_companions(&path)) {
                fs::write(&file, b"x").unwrap();
                fs::set_permissions(&file, fs::Permissions::from_mode(0o664)).unwrap();
            }
            let tightened = prepare_private_file(&path).unwrap();
            assert_eq!(tightened.len(), 4, "{tightened:?}");
            for file in std::iter::once(path.clone()).chain(sqlite_companions(&path)) {
                assert_eq!(mode(&file), 0o600, "{}", file.display());
            }
            assert_eq!(fs::read(&path).unwrap(), b"x", "contents kept");
            assert!(prepare_private_file(&path).unwrap().is_empty());
        }
    }

    #[test]
    fn a_private_write_replaces_a_loose_file_with_a_0600_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conf/edge.yaml");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_private_file(&path, b"token: t").unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(fs::read_to_string(&path).unwrap(), "token: t");
        let fresh = dir.path().join("new/dir/edge.yaml");
        write_private_file(&fresh, b"x").unwrap();
        assert_eq!(mode(&fresh), 0o600);
        assert_eq!(mode(fresh.parent().unwrap()), 0o700);
    }
}
