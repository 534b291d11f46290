//! Where the pod template lets its pods run: its `nodeName`, its `nodeSelector`, its required
//! node affinity and its tolerations (with those the cluster adds for the extended resources it
//! requests), read the way kube-scheduler and the kubelet read them. They narrow the candidate
//! nodes before any node class is chosen, so the decision never picks a class the pods cannot
//! land on, and the affinity the operator adds never contradicts the template's.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Toleration};

use crate::index::{NodeInfo, NodeTaint};

/// The template's placement constraints.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodConstraints {
    /// `spec.nodeSelector`: every label must match.
    pub node_selector: BTreeMap<String, String>,
    /// `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`: at least one term
    /// must match (`None`: no required affinity).
    pub required_terms: Option<Vec<NodeSelectorTerm>>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
    /// `spec.nodeName`: the pods are bound to this node without the scheduler, so only it can
    /// run them, and only its `NoExecute` taints keep them off (the kubelet admits a pod whatever
    /// its `NoSchedule` taints).
    pub node_name: Option<String>,
    /// The extended resources the containers ask for (`nvidia.com/gpu`): on clusters that run
    /// the `ExtendedResourceToleration` admission plugin (the usual way GPU pools are tainted
    /// `nvidia.com/gpu:NoSchedule`), every pod that asks for one is given the toleration
    /// `{key: <resource>, operator: Exists, effect: NoSchedule}`, so such a taint does not keep
    /// these pods off.
    pub extended_resources: BTreeSet<String>,
    /// Whether the API server runs that plugin, as the operator was told
    /// ([`crate::decision::ClusterView::extended_resource_toleration`]); off, only the template's own
    /// tolerations count.
    pub extended_resource_toleration: bool,
    /// The CPU cores the pod asks the scheduler for: its containers' CPU requests, a limit
    /// standing for the request where a container sets none (as the API server defaults it).
    /// A node with fewer allocatable cores never takes the pod.
    pub cpu_request: Option<f64>,
}

/// Most excluded nodes a message names; the rest are counted.
const NAMED: usize = 4;

/// Most `nodeSelector` pairs [`PodConstraints::describe`] echoes; the rest are counted.
const ECHOED_PAIRS: usize = 8;

/// Most characters of a label key, value or node name a message echoes (a template's strings
/// are not validated as labels before the operator reads them).
const ECHOED_CHARS: usize = 128;

/// `s` for a message: at most [`ECHOED_CHARS`] characters.
fn echo(s: &str) -> String {
    offload_api::text::bounded_to(s, ECHOED_CHARS)
}

/// The CPU cores a pod asks for: the sum of its containers' CPU requests (a limit where a
/// container sets no request, the namespace's LimitRange default where it sets neither), at
/// least the largest init container's; `None` where none asks.
fn cpu_request(spec: &PodSpec, default: Option<f64>) -> Option<f64> {
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        let q = r
            .and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get("cpu"))
            .or_else(|| r.and_then(|r| r.limits.as_ref()).and_then(|m| m.get("cpu")));
        match q {
            Some(q) => offload_api::quantity::cpu_cores(q).ok(),
            None => default,
        }
    };
    let app: Vec<f64> = spec.containers.iter().filter_map(of).collect();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter_map(of)
        .fold(None, |m: Option<f64>, c| Some(m.map_or(c, |m| m.max(c))));
    let sum = (!app.is_empty()).then(|| app.iter().sum::<f64>());
    match (sum, init) {
        (Some(a), Some(i)) => Some(a.max(i)),
        (a, i) => a.or(i),
    }
    .filter(|c| c.is_finite() && *c > 0.0)
}

/// Whether Kubernetes counts `name` as an extended resource: a name outside the
/// `kubernetes.io` domains (`cpu`, `memory`, `hugepages-2Mi` have no domain at all), and not a
/// quota's `requests.` form.
fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

impl PodConstraints {
    /// The constraints with the CPU request counted as the API server will make it where a
    /// container that sets no CPU gets `default` cores (a LimitRange's default request:
    /// [`crate::decision::PodResources::cpu_default_request`]).
    pub fn in_namespace(self, spec: Option<&PodSpec>, default: Option<f64>) -> PodConstraints {
        match spec {
            Some(spec) if default.is_some() => PodConstraints {
                cpu_request: cpu_request(spec, default),
                ..self
            },
            _ => self,
        }
    }

    /// The constraints with what the cluster's API server adds to every pod, as `view` was told.
    pub fn on_cluster(self, view: &dyn crate::decision::ClusterView) -> PodConstraints {
        PodConstraints {
            extended_resource_toleration: view.extended_resource_toleration(),
            ..self
        }
    }

    /// The constraints of a pod spec.
    pub fn of(spec: Option<&PodSpec>) -> PodConstraints {
        let Some(spec) = spec else {
            return PodConstraints::default();
        };
        let extended_resources = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| c.resources.as_ref())
            .flat_map(|r| {
                r.requests
                    .iter()
                    .flatten()
                    .chain(r.limits.iter().flatten())
                    .map(|(name, _)| name)
            })
            .filter(|name| is_extended_resource(name))
            .cloned()
            .collect();
        PodConstraints {
            cpu_request: cpu_request(spec, None),
            node_name: spec.node_name.clone().filter(|n| !n.is_empty()),
            extended_resources,
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required_terms: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|r| r.node_selector_terms.clone()),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            extended_resource_toleration: false,
        }
    }

    /// Why the pods could not land on `node`, or `None` where they can.
    pub fn excludes(&self, node: &NodeInfo) -> Option<String> {
        if let Some(name) = &self.node_name
            && *name != node.name
        {
            return Some(format!(
                "the pod template's nodeName is {:?} (the scheduler is bypassed)",
                echo(name)
            ));
        }
        // The kubelet checks the selector and the affinity of a pod bound by nodeName as the
        // scheduler would.
        for (key, value) in &self.node_selector {
            match node.labels.get(key) {
                Some(v) if v == value => {}
                Some(v) => {
                    return Some(format!(
                        "its label {} is {:?}, the nodeSelector asks for {:?}",
                        echo(key),
                        echo(v),
                        echo(value)
                    ));
                }
                None => {
                    return Some(format!(
                        "it has no label {} (the nodeSelector asks for {:?})",
                        echo(key),
                        echo(value)
                    ));
                }
            }
        }
        if let Some(terms) = &self.required_terms
            && !terms.iter().any(|t| term_matches(t, node))
        {
            return Some("no term of the required node affinity matches its labels".into());
        }
        #[allow(clippy::cast_precision_loss)]
        if let (Some(want), Some(have)) = (self.cpu_request, node.allocatable.cpus)
            && want > have as f64
        {
            return Some(format!(
                "it has {have} allocatable CPU cores, the pod asks for {want} (its containers' CPU requests, their limits where they set none, or the namespace's LimitRange default where they set neither)"
            ));
        }
        node.taints
            .iter()
            .find(|t| {
                blocks(t)
                    // Bound by nodeName, the pods skip the scheduler: only NoExecute evicts.
                    && (self.node_name.is_none() || t.effect == "NoExecute")
                    && !self.tolerations.iter().any(|tol| tolerates(tol, t))
                    && !self.added_toleration(t)
            })
            .map(|t| {
                // Where the API server would add the toleration itself, that is the other fix.
                let or = if self.would_add(t) {
                    " (add a toleration of it to the pod template, or, where the API server runs the ExtendedResourceToleration admission plugin, set the chart value operator.extendedResourceToleration)"
                } else {
                    ""
                };
                format!(
                    "its taint {}{}:{} is not tolerated{or}",
                    echo(&t.key),
                    t.value
                        .as_deref()
                        .map(|v| format!("={}", echo(v)))
                        .unwrap_or_default(),
                    t.effect
                )
            })
    }

    /// Whether the toleration `ExtendedResourceToleration` adds for an extended resource the
    /// pods ask for tolerates `t`.
    fn added_toleration(&self, t: &NodeTaint) -> bool {
        self.extended_resource_toleration && self.would_add(t)
    }

    /// Whether `ExtendedResourceToleration`, where it runs, would add a toleration of `t`.
    fn would_add(&self, t: &NodeTaint) -> bool {
        t.effect == "NoSchedule" && self.extended_resources.contains(&t.key)
    }

    /// The constraints in a phrase, for messages: `nodeSelector {offload.dev/uma=false}, no
    /// tolerations`; at most [`ECHOED_PAIRS`] selector pairs are echoed.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(name) = &self.node_name {
            parts.push(format!("nodeName {}", echo(name)));
        }
        if !self.node_selector.is_empty() {
            let pairs: Vec<String> = self
                .node_selector
                .iter()
                .take(ECHOED_PAIRS)
                .map(|(k, v)| format!("{}={}", echo(k), echo(v)))
                .collect();
            let more = self.node_selector.len().saturating_sub(ECHOED_PAIRS);
            parts.push(format!(
                "nodeSelector {{{}{}}}",
                pairs.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if let Some(terms) = &self.required_terms {
            parts.push(format!(
                "required node affinity ({} term{})",
                terms.len(),
                if terms.len() == 1 { "" } else { "s" }
            ));
        }
        parts.push(if self.tolerations.is_empty() {
            "no tolerations".to_string()
        } else {
            format!("{} toleration(s)", self.tolerations.len())
        });
        if self.extended_resource_toleration && !self.extended_resources.is_empty() {
            let names: Vec<String> = self
                .extended_resources
                .iter()
                .take(ECHOED_PAIRS)
                .map(|n| echo(n))
                .collect();
            parts.push(format!(
                "counting the NoSchedule toleration of {} that the ExtendedResourceToleration \
                 admission plugin adds",
                names.join(", ")
            ));
        }
        parts.join(", ")
    }

    /// What the constraints leave out of `nodes`, in a sentence (`None`: nothing).
    pub fn left_out<'a>(&self, nodes: impl Iterator<Item = &'a NodeInfo>) -> Option<String> {
        let mut named = Vec::new();
        let mut count = 0usize;
        for n in nodes {
            if let Some(why) = self.excludes(n) {
                count += 1;
                if named.len() < NAMED {
                    named.push(format!("{} ({why})", n.name));
                }
            }
        }
        (count > 0).then(|| {
            let more = count - named.len();
            format!(
                "the pod template's constraints ({}) leave out {count} node(s): {}{}",
                self.describe(),
                named.join("; "),
                if more > 0 {
                    format!("; and {more} more")
                } else {
                    String::new()
                }
            )
        })
    }
}

/// Only these effects keep a pod off a node, and only taints of policy: the ones Kubernetes
/// itself sets from a node's conditions (`node.kubernetes.io/not-ready`, `…/unreachable`,
/// `…/memory-pressure`, `…/unschedulable` when cordoned, …) say the node is away for now, not
/// that the job may not run there — kube-scheduler waits for them to clear, and a decision made
/// once for the job's lifetime must not move it to another class for a node restarting.
fn blocks(t: &NodeTaint) -> bool {
    (t.effect == "NoSchedule" || t.effect == "NoExecute")
        && !t.key.starts_with("node.kubernetes.io/")
}

/// Kubernetes' toleration rule: the key matches (an empty key with `Exists` matches every
/// key), the value matches under `Equal` (the default), and the effect matches or is empty.
fn tolerates(tol: &Toleration, taint: &NodeTaint) -> bool {
    let exists = tol.operator.as_deref() == Some("Exists");
    let key = tol.key.as_deref().unwrap_or_default();
    if key.is_empty() && !exists {
        return false;
    }
    if !key.is_empty() && key != taint.key {
        return false;
    }
    let value_ok = exists
        || tol.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default();
    let effect_ok = tol
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    value_ok && effect_ok
}

/// A node selector term: every expression and field requirement holds. An empty term matches
/// nothing (as kube-scheduler reads it).
fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node.name.as_str())))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => match (
            value.and_then(number),
            values.first().and_then(|x| number(x)),
        ) {
            (Some(v), Some(bound)) if values.len() == 1 => {
                if r.operator == "Gt" {
                    v > bound
                } else {
                    v < bound
                }
            }
            _ => false,
        },
        // An operator the API server would not have stored: matches nothing.
        _ => false,
    }
}

#[cfg(test)]
mod tests;
