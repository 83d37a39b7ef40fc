//! The simulated CUDA runtime behaves like a GPU where a tracer can tell the difference:
//! asynchrony, stream ordering, copy semantics, graph capture and device pointers.

use std::os::unix::process::ExitStatusExt;

use integration_tests::{describe, probe};

fn passes(name: &str) {
    let out = probe(&[name]);
    assert!(
        out.status.success(),
        "probe {name} failed\n{}",
        describe(&out)
    );
}

#[test]
fn a_read_before_synchronising_sees_stale_data() {
    passes("stale-read");
}

#[test]
fn streams_are_ordered_only_by_events_and_the_legacy_stream() {
    passes("stream-order");
}

#[test]
fn pageable_copies_stage_or_block_and_pointers_are_classified() {
    passes("pageable-copies");
}

#[test]
fn captured_work_runs_only_on_graph_launch_and_unsafe_calls_invalidate_capture() {
    passes("capture");
}

#[test]
fn captured_copies_are_memcpy_nodes_an_instance_can_redirect_for_later_launches() {
    passes("graph-nodes");
}

#[test]
fn errors_follow_the_last_error_protocol() {
    passes("errors");
}

#[test]
fn host_dereference_of_a_device_pointer_faults() {
    let out = probe(&["device-deref"]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "expected SIGSEGV\n{}",
        describe(&out)
    );
}
