//! `offload-agent`: the node agent.
fn main() {}
