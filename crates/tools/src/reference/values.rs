//! Every chart value: its type and bounds from `values.schema.json`, its default from
//! `values.yaml`, its description from the schema (each value must have one).

use serde_json::Value;

use super::markdown::{GENERATED, table};

const SCHEMA: &str = include_str!("../../../../charts/offload-operator/values.schema.json");
const VALUES: &str = include_str!("../../../../charts/offload-operator/values.yaml");

/// The page.
pub fn page() -> Result<String, String> {
    let schema: Value =
        serde_json::from_str(SCHEMA).map_err(|e| format!("values.schema.json: {e}"))?;
    let defaults: Value =
        serde_saphyr::from_str(VALUES).map_err(|e| format!("values.yaml: {e}"))?;
    let mut rows = Vec::new();
    walk("", &schema, &defaults, &mut rows)?;
    let mut out = format!(
        "{GENERATED}\n\n# Chart values\n\nEvery value of `charts/offload-operator`, checked by its \
         `values.schema.json` at `helm install` and `helm upgrade` (an unknown key is refused).\n\n"
    );
    out.push_str(&table(&["value", "type", "default", "description"], &rows));
    Ok(out)
}

fn walk(
    path: &str,
    schema: &Value,
    defaults: &Value,
    rows: &mut Vec<Vec<String>>,
) -> Result<(), String> {
    let Some(props) = schema["properties"].as_object() else {
        return Ok(());
    };
    for (name, sub) in props {
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let Some(description) = sub["description"].as_str() else {
            return Err(format!(
                "chart value {here} has no description in values.schema.json"
            ));
        };
        let default = &defaults[name];
        let nested = sub["properties"].is_object();
        let shown = if nested || default.is_null() {
            String::new()
        } else {
            format!("`{}`", compact(default))
        };
        rows.push(vec![
            format!("`{here}`"),
            kind(sub),
            shown,
            facts(description, sub),
        ]);
        walk(&here, sub, default, rows)?;
    }
    Ok(())
}

/// The value's type.
fn kind(schema: &Value) -> String {
    match &schema["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ if schema["enum"].is_array() => "string".into(),
        _ => "any".into(),
    }
}

/// The description, then the values and bounds the schema allows.
fn facts(description: &str, schema: &Value) -> String {
    let mut text = description.to_string();
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", compact(v))).collect();
        text.push_str(&format!(" One of {}.", values.join(", ")));
    }
    match (schema.get("minimum"), schema.get("maximum")) {
        (Some(min), Some(max)) => text.push_str(&format!(" From {min} to {max}.")),
        (Some(min), None) => text.push_str(&format!(" At least {min}.")),
        (None, Some(max)) => text.push_str(&format!(" At most {max}.")),
        (None, None) => {}
    }
    text
}

/// A default as a reader writes it in a values file.
fn compact(v: &Value) -> String {
    match v {
        Value::String(s) if s.is_empty() => "\"\"".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
