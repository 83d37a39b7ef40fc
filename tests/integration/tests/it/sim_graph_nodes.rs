//! Graphs built node by node on the simulated runtime (`cudaGraphCreate`, `cudaGraphAdd*Node`):
//! their nodes are reported in order with their types, and an instance replays their copies
//! and memsets in an order that respects their dependencies, after the stream's earlier work.

use integration_tests::{describe, probe};

#[test]
fn graphs_built_node_by_node_replay_their_copies_and_memsets_in_dependency_order() {
    let out = probe(&["graph-build"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("graph-build OK"),
        "probe graph-build failed\n{}",
        describe(&out)
    );
}
