//! What a decision costs, counted: the nodes it reads from the index. After the first decision
//! against an index (which works the selection and the classes' facts out), a decision reads as
//! many nodes on a cluster of 20,000 as on one of 20 — its cost does not grow with the cluster.

use super::*;

/// `n` nodes: a third coherent, the rest discrete.
fn cluster(n: usize) -> NodeIndex {
    let nodes: Vec<NodeInfo> = (0..n)
        .map(|i| {
            if i % 3 == 0 {
                gh200(&format!("gh200-{i:05}"))
            } else {
                h200(&format!("h200-{i:05}"))
            }
        })
        .collect();
    idx(&nodes)
}

/// The nodes the decisions of `jobs` read from `index` (after one decision of each warmed it).
fn visits(index: &NodeIndex, jobs: &[JobRequest]) -> u64 {
    let profile = profile();
    for job in jobs {
        resolve_offload(job, "p", &profile, index).unwrap();
    }
    let before = index.visits();
    for job in jobs {
        resolve_offload(job, "p", &profile, index).unwrap();
    }
    index.visits() - before
}

fn jobs() -> Vec<JobRequest> {
    let sized = |parameters: u64, pods: u32| JobRequest {
        model: Some(offload_api::v1alpha1::ModelHints {
            parameters: Some(offload_api::quantity::ParameterCount::new(parameters).unwrap()),
            ..Default::default()
        }),
        pods,
        ..deepspeed("0.19.8")
    };
    vec![
        deepspeed("0.19.8"),
        sized(8_000_000_000, 1),
        sized(70_000_000_000, 4),
        generic(),
    ]
}

#[test]
fn a_decisions_cost_does_not_grow_with_the_nodes_of_a_class() {
    let jobs = jobs();
    let small = visits(&cluster(20), &jobs);
    let large = visits(&cluster(20_000), &jobs);
    assert_eq!(
        small, large,
        "nodes read by the same decisions on 20 and on 20,000 nodes: {small} vs {large}"
    );
    // And few: the names a reason shows (at most three per class), nothing per node.
    assert!(large <= 12 * jobs.len() as u64, "{large} nodes read");
}

#[test]
fn the_selection_is_worked_out_once_per_index() {
    let index = cluster(300);
    let profile = profile();
    let job = deepspeed("0.19.8");
    resolve_offload(&job, "p", &profile, &index).unwrap();
    let built = index.memo_builds();
    for _ in 0..50 {
        resolve_offload(&job, "p", &profile, &index).unwrap();
    }
    assert_eq!(index.memo_builds(), built, "nothing worked out again");
    // Another selector is another selection; a new index (a node changed) starts afresh.
    let other = OffloadProfileSpec {
        node_selector: Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    names::LABEL_UMA.to_string(),
                    "false".to_string(),
                )])),
                ..Default::default()
            },
        ),
        ..profile.clone()
    };
    resolve_offload(&job, "p", &other, &index).unwrap();
    assert_eq!(index.memo_builds(), built + 1);
    assert_eq!(cluster(300).memo_builds(), 0);
}
