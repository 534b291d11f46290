//! Kubernetes' own rules for names and label selectors, checked before the operator writes an
//! object that carries them, so a name the API server would refuse is denied at admission with
//! the rule, not found later as a failed write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Longest DNS label (RFC 1035): a Service's name, a pod's hostname.
pub const MAX_DNS_LABEL: usize = 63;

fn is_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// A DNS-1035 label: lowercase letters, digits and `-`, starting with a letter, ending with a
/// letter or digit, at most `max` characters.
pub fn dns_label(name: &str, max: usize) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(is_alnum)
        && name.chars().all(|c| is_alnum(c) || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a DNS label of at most {max} characters (lowercase letters, digits and '-', starting with a letter, ending with a letter or digit)"
        ))
    }
}

/// A DNS-1123 subdomain: dot-separated lowercase labels, at most 253 characters.
fn dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.starts_with(is_alnum)
                && part.ends_with(is_alnum)
                && part.chars().all(|c| is_alnum(c) || c == '-')
        })
}

/// An object name as most kinds take it (ConfigMaps, Kueue's LocalQueues): a DNS-1123
/// subdomain — at most 253 characters of dot-separated lowercase labels of letters, digits and
/// `-`, each starting and ending with a letter or digit.
pub fn object_name(name: &str) -> Result<(), String> {
    if dns_subdomain(name) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a DNS-1123 subdomain (at most 253 characters of lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
        ))
    }
}

/// The name part of a label key or value: at most 63 characters of letters, digits, `-`, `_`
/// and `.`, starting and ending with a letter or digit.
fn qualified_name(name: &str) -> bool {
    let edge = |c: char| c.is_ascii_alphanumeric();
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(edge)
        && name.ends_with(edge)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain.
pub fn label_key(key: &str) -> Result<(), String> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => dns_subdomain(prefix) && qualified_name(name),
        None => qualified_name(key),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "label key {key:?} is not valid: an optional DNS-subdomain prefix and '/', then up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

/// A label value: empty, or a qualified name.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || qualified_name(value) {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?} is not valid: up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

/// A label selector whose keys, values and operators the API server would take.
pub fn label_selector(sel: &LabelSelector) -> Result<(), String> {
    for (k, v) in sel.match_labels.iter().flatten() {
        label_key(k)?;
        label_value(v)?;
    }
    for e in sel.match_expressions.iter().flatten() {
        label_key(&e.key)?;
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "matchExpressions on {:?}: operator {} needs values",
                    e.key, e.operator
                ));
            }
            "In" | "NotIn" => {}
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!(
                    "matchExpressions on {:?}: operator {} takes no values",
                    e.key, e.operator
                ));
            }
            "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "matchExpressions on {:?}: operator {other:?} is not In, NotIn, Exists or DoesNotExist",
                    e.key
                ));
            }
        }
        for v in values {
            label_value(v)?;
        }
    }
    Ok(())
}

/// Directories a config volume must not be mounted over: the root and the system trees a
/// container needs to start.
const SYSTEM_PATHS: [&str; 15] = [
    "/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin",
    "/sys", "/tmp", "/usr", "/var",
];

/// A directory to mount a file-carrying volume at: absolute, normalised, not the root or a
/// system tree (nor inside `/proc`, `/sys` or `/dev`).
pub fn mount_path(path: &str) -> Result<(), String> {
    let trimmed = if path.len() > 1 {
        path.trim_end_matches('/')
    } else {
        path
    };
    if !trimmed.starts_with('/')
        || trimmed.contains("//")
        || trimmed.chars().any(char::is_control)
        || trimmed.split('/').any(|part| part == "." || part == "..")
    {
        return Err(format!(
            "{path:?} is not an absolute, normalised directory (no '.', '..' or empty parts)"
        ));
    }
    if SYSTEM_PATHS.contains(&trimmed)
        || ["/proc/", "/sys/", "/dev/"]
            .iter()
            .any(|p| trimmed.starts_with(p))
    {
        return Err(format!(
            "{path:?} would hide a directory the container needs to start: mount the config elsewhere, e.g. /etc/offload"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kubernetes_rules() {
        assert!(dns_label("llama-8b", 63).is_ok());
        for bad in ["rel.dot", "Upper", "-x", "x-", "", &"a".repeat(70), "8b"] {
            assert!(dns_label(bad, 63).is_err(), "{bad}");
        }
        assert!(label_key("offload.dev/test-pool").is_ok());
        assert!(label_key("pool").is_ok());
        for bad in ["a b", "/x", "x/", "UPPER.dev/x", "a/b/c", &"k".repeat(64)] {
            assert!(label_key(bad).is_err(), "{bad}");
        }
        assert!(label_value("").is_ok() && label_value("v1.2_a-b").is_ok());
        assert!(label_value("a b").is_err());
    }

    #[test]
    fn selectors_are_checked_as_the_api_server_checks_them() {
        let sel =
            |json: serde_json::Value| -> LabelSelector { serde_json::from_value(json).unwrap() };
        assert!(
            label_selector(&sel(
                serde_json::json!({"matchLabels": {"pool": "training"}})
            ))
            .is_ok()
        );
        for bad in [
            serde_json::json!({"matchLabels": {"a b": "x"}}),
            serde_json::json!({"matchExpressions": [{"key": "k", "operator": "In"}]}),
            serde_json::json!({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["x"]}]}),
            serde_json::json!({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]}),
        ] {
            assert!(label_selector(&sel(bad.clone())).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_config_is_never_mounted_over_the_system() {
        assert!(mount_path("/etc/offload").is_ok());
        assert!(mount_path("/workspace/config/").is_ok());
        for bad in [
            "/",
            "/etc",
            "/usr/",
            "/proc/self",
            "relative",
            "/a/../etc",
            "/a//b",
            "/x\u{0}y",
        ] {
            assert!(mount_path(bad).is_err(), "{bad}");
        }
    }
}
