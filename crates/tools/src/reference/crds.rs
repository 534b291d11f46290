//! Every field of the CRDs, from the schemas the API types generate (what `kubectl explain`
//! shows), one table per kind.

use offload_api::v1alpha1::crds;
use serde_json::Value;

use super::markdown::{GENERATED, table};

/// Nesting past which a schema is not walked (the CRDs are far shallower).
const MAX_DEPTH: usize = 12;

/// The page.
pub fn page() -> Result<String, String> {
    let mut out = format!(
        "{GENERATED}\n\n# Custom resources\n\nGroup `{}`, version `{}`. `kubectl explain trainingjob.spec` shows the same \
         descriptions; the CRDs in `crds/` are generated from the same types.\n",
        offload_api::names::GROUP,
        offload_api::names::VERSION
    );
    for crd in crds() {
        let crd = serde_json::to_value(&crd).map_err(|e| e.to_string())?;
        let names = &crd["spec"]["names"];
        let kind = names["kind"].as_str().unwrap_or_default();
        let short: Vec<&str> = names["shortNames"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let scope = crd["spec"]["scope"].as_str().unwrap_or_default();
        out.push_str(&format!(
            "\n## {kind}\n\n{scope}; short names: {}.\n",
            short
                .iter()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let versions = crd["spec"]["versions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for version in versions {
            let schema = &version["schema"]["openAPIV3Schema"];
            for part in ["spec", "status"] {
                let mut rows = Vec::new();
                fields(part, &schema["properties"][part], 0, &mut rows);
                if rows.is_empty() {
                    continue;
                }
                out.push_str(&format!("\n### `{part}`\n\n"));
                out.push_str(&table(&["field", "type", "description"], &rows));
            }
        }
    }
    Ok(out)
}

/// The rows of `schema` at `path` and below.
fn fields(path: &str, schema: &Value, depth: usize, rows: &mut Vec<Vec<String>>) {
    if depth > MAX_DEPTH {
        return;
    }
    if depth > 0 {
        rows.push(vec![
            format!("`{path}`"),
            type_of(schema),
            description(schema),
        ]);
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, sub) in props {
            fields(&format!("{path}.{name}"), sub, depth + 1, rows);
        }
    }
    if schema["type"] == "array"
        && let Some(props) = schema["items"]["properties"].as_object()
    {
        for (name, sub) in props {
            fields(&format!("{path}[].{name}"), sub, depth + 1, rows);
        }
    }
}

/// The field's type as a reader writes it.
fn type_of(schema: &Value) -> String {
    if schema["x-kubernetes-int-or-string"] == true {
        return "integer or string".into();
    }
    match schema["type"].as_str() {
        Some("array") => format!("[]{}", type_of(&schema["items"])),
        Some(t) => match schema["format"].as_str() {
            Some(f) => format!("{t} ({f})"),
            None => t.to_string(),
        },
        None if schema["x-kubernetes-preserve-unknown-fields"] == true => "object".into(),
        None => "any".into(),
    }
}

/// The description, then the allowed values, default and bounds the schema states.
fn description(schema: &Value) -> String {
    let mut text = schema["description"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut facts = Vec::new();
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| format!("`{}`", plain(v)))
            .collect();
        facts.push(format!("One of {}.", values.join(", ")));
    }
    if !schema["default"].is_null() {
        facts.push(format!("Default `{}`.", plain(&schema["default"])));
    }
    match (schema.get("minimum"), schema.get("maximum")) {
        (Some(min), Some(max)) => facts.push(format!("From {min} to {max}.")),
        (Some(min), None) => facts.push(format!("At least {min}.")),
        (None, Some(max)) => facts.push(format!("At most {max}.")),
        (None, None) => {}
    }
    for fact in facts {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&fact);
    }
    text
}

/// A JSON value as it reads in prose (strings without quotes).
fn plain(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}
