//! The well-known names of `offload_api::names`, read from its source with its doc comments:
//! the labels and annotations page and the env var page.

use std::collections::BTreeMap;

use syn::{Expr, ExprLit, Item, Lit, Meta};

use super::markdown::{GENERATED, table};

/// The source of `offload_api::names`, as built into this tool.
const SOURCE: &str = include_str!("../../../api/src/names.rs");

/// One `pub const NAME: &str = "value";` with its doc comment.
struct Name {
    ident: String,
    value: String,
    doc: String,
}

/// An item's doc comment as one line of prose.
pub fn doc_of(attrs: &[syn::Attribute]) -> String {
    attrs
        .iter()
        .filter_map(|a| match &a.meta {
            Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(s), ..
                }) => Some(s.value().trim().to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every string constant of the module, in source order.
fn names() -> Result<Vec<Name>, String> {
    let file = syn::parse_file(SOURCE).map_err(|e| format!("names.rs: {e}"))?;
    let mut out = Vec::new();
    for item in file.items {
        let Item::Const(c) = item else { continue };
        let Expr::Lit(ExprLit {
            lit: Lit::Str(value),
            ..
        }) = c.expr.as_ref()
        else {
            continue;
        };
        let doc = doc_of(&c.attrs);
        out.push(Name {
            ident: c.ident.to_string(),
            value: value.value(),
            doc,
        });
    }
    if out.is_empty() {
        return Err("names.rs holds no string constants".into());
    }
    Ok(out)
}

/// Rustdoc links made plain: a link to another constant reads as its value; any other item as
/// its last path segment.
fn prose(doc: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(doc.len());
    let mut rest = doc;
    while let Some(start) = rest.find("[`") {
        let Some(len) = rest[start..].find("`]") else {
            break;
        };
        out.push_str(&rest[..start]);
        let target = &rest[start + 2..start + len];
        let shown = values.get(target).map_or_else(
            || target.rsplit("::").next().unwrap_or(target).to_string(),
            Clone::clone,
        );
        out.push_str(&format!("`{shown}`"));
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// The rows for the names whose identifier `keep` accepts.
fn rows(all: &[Name], keep: impl Fn(&str) -> bool) -> Vec<Vec<String>> {
    let values: BTreeMap<String, String> = all
        .iter()
        .map(|n| (n.ident.clone(), n.value.clone()))
        .collect();
    all.iter()
        .filter(|n| keep(&n.ident))
        .map(|n| vec![format!("`{}`", n.value), prose(&n.doc, &values)])
        .collect()
}

/// The labels and annotations page.
pub fn labels_page() -> Result<String, String> {
    let all = names()?;
    let mut out = format!(
        "{GENERATED}\n\n# Labels and annotations\n\nEvery label and annotation the operator, the webhook \
         and the agent read or write. Keys under `offload.dev/` are the project's; none lives under \
         `nvidia.com/` or `feature.node.kubernetes.io/`, so the agent never fights GPU Feature \
         Discovery or Node Feature Discovery over a key.\n\n## Labels\n\n"
    );
    let label =
        |i: &str| i.starts_with("LABEL_") || i.ends_with("_LABEL") || i == "PROFILE_ANNOTATION";
    out.push_str(&table(&["label", "meaning"], &rows(&all, label)));
    out.push_str("\n## Annotations\n\n");
    let annotation = |i: &str| i.starts_with("ANNOTATION_") || i == "PROFILE_ANNOTATION";
    out.push_str(&table(&["annotation", "meaning"], &rows(&all, annotation)));
    out.push_str("\n## Field managers\n\nWho owns which fields (`kubectl get -o yaml --show-managed-fields`).\n\n");
    out.push_str(&table(
        &["manager", "meaning"],
        &rows(&all, |i| i.ends_with("_MANAGER")),
    ));
    out.push_str("\n## Other names\n\n");
    let other =
        |i: &str| !(label(i) || annotation(i) || i.starts_with("ENV_") || i.ends_with("_MANAGER"));
    out.push_str(&table(&["name", "meaning"], &rows(&all, other)));
    Ok(out)
}

/// The env var page.
pub fn env_page() -> Result<String, String> {
    let all = names()?;
    let mut out = format!(
        "{GENERATED}\n\n# Environment variables\n\nWhat reaches the training process: the webhook and the \
         controller write these into configured containers (an `OFFLOAD_*` variable the user set is \
         replaced; `OMP_NUM_THREADS` only where the container sets none).\n\n"
    );
    out.push_str(&table(
        &["variable", "meaning"],
        &rows(&all, |i| i.starts_with("ENV_")),
    ));
    Ok(out)
}

/// The Events page.
pub fn events_page() -> Result<String, String> {
    let all = names()?;
    let mut out = format!(
        "{GENERATED}\n\n# Events\n\nThe Events the operator and the webhook write, through the core Events API \
         (`kubectl describe`, `kubectl get events --sort-by=.lastTimestamp`). A TrainingJob that \
         cannot be decided also gets a Warning Event whose reason is the code that holds it \
         ([Troubleshooting](../troubleshooting.md)).\n\n"
    );
    // Each doc reads "Event reason (TYPE[, on OBJECT]): MEANING".
    let events: Vec<Vec<String>> = rows(&all, |i| i.starts_with("EVENT_"))
        .into_iter()
        .map(|row| {
            let doc = row[1].strip_prefix("Event reason (").unwrap_or(&row[1]);
            let (inner, meaning) = doc.split_once("): ").unwrap_or(("", doc));
            let (kind, object) = inner.split_once(", ").unwrap_or((inner, ""));
            let meaning = if object.is_empty() {
                meaning.to_string()
            } else {
                format!("{object}: {meaning}")
            };
            vec![row[0].clone(), kind.to_string(), meaning]
        })
        .collect();
    if events.iter().any(|e| e[1].is_empty()) {
        return Err("an EVENT_ name's doc does not start with \"Event reason (TYPE…): \"".into());
    }
    out.push_str(&table(&["reason", "type", "meaning"], &events));
    Ok(out)
}
