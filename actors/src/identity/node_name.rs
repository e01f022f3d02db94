//! Node names: what the cloud accepts as the name of an edge node.

/// Longest node name (a DNS subdomain, like Kubernetes node names).
pub(crate) const MAX_NODE_NAME_LEN: usize = 253;

/// Whether `name` can be a Kubernetes node name: a DNS-1123 subdomain (at most 253
/// characters; dot-separated labels of lowercase letters, digits and `-`, each starting and
/// ending with a letter or digit). `Err` says what is wrong, for the refusal.
pub fn check_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty node name".into());
    }
    if name.len() > MAX_NODE_NAME_LEN {
        return Err(format!(
            "node name longer than {MAX_NODE_NAME_LEN} characters"
        ));
    }
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= 63
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!(
            "invalid node name {:?}: use lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit",
            name.chars().take(64).collect::<String>()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_follow_kubernetes_rules() {
        for good in ["edge-1", "a", "node.example.com", "1a-b2"] {
            assert_eq!(check_node_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "../../etc",
            "Edge-1",
            "-edge",
            "edge-",
            "a..b",
            "a_b",
            "é",
        ] {
            assert!(check_node_name(bad).is_err(), "{bad}");
        }
        assert!(check_node_name(&"a".repeat(254)).is_err());
        assert!(check_node_name(&format!("{}.b", "a".repeat(64))).is_err());
    }
}
