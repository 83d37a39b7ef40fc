//! Group semantics (per thread, nestable) and kernel launch.
//!
//! Inside `ncclGroupStart` / `ncclGroupEnd` operations are only recorded; the outermost
//! `ncclGroupEnd` launches all of them as one task (see `exec.rs`). A tracer that enqueues a
//! copy right after a call inside a group therefore copies stale data, exactly as on a GPU.
//! Communicators initialised inside a group register at the call and wait for their peers at
//! the outermost `ncclGroupEnd` (the single-thread, several-devices pattern).

use std::cell::RefCell;
use std::sync::Arc;

use cuda_abi::cudart::*;
use cuda_abi::nccl::*;

use crate::comm::{fail_code, lock, Comm};
use crate::exec::{Op, Task, LAUNCH};
use crate::shm::Fail;

#[derive(Default)]
struct Group {
    depth: u32,
    ops: Vec<Op>,
    inits: Vec<Arc<Comm>>,
    /// First error of a call inside the group; `ncclGroupEnd` returns it.
    error: ncclResult_t,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// `ncclGroupStart`.
pub fn start() -> ncclResult_t {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    ncclSuccess
}

/// Whether the calling thread is inside a group.
pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Records the error of a call made inside a group (the group end reports it).
pub fn note_error(code: ncclResult_t) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error == ncclSuccess {
            g.error = code;
        }
    });
}

/// Defers the wait of an init made inside a group to the outermost `ncclGroupEnd`.
pub fn defer_init(comm: Arc<Comm>) {
    GROUP.with(|g| g.borrow_mut().inits.push(comm));
}

/// Records `op` inside a group, or launches it now.
pub fn enqueue(op: Op) -> ncclResult_t {
    let op = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push(op);
            None
        } else {
            Some(op)
        }
    });
    match op {
        Some(op) => launch(vec![op]),
        None => ncclSuccess,
    }
}

/// `ncclGroupEnd`.
pub fn end() -> ncclResult_t {
    let taken = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(ncclInvalidUsage);
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        let ops = std::mem::take(&mut g.ops);
        let inits = std::mem::take(&mut g.inits);
        let error = std::mem::replace(&mut g.error, ncclSuccess);
        Ok(Some((ops, inits, error)))
    });
    let (ops, inits, error) = match taken {
        Err(e) => {
            crate::set_last_error("ncclGroupEnd without ncclGroupStart");
            return e;
        }
        Ok(None) => return ncclSuccess,
        Ok(Some(t)) => t,
    };
    if error != ncclSuccess {
        // NCCL drops the whole group after a failed call inside it.
        return error;
    }
    for c in &inits {
        if let Err(f) = c.wait_ready() {
            return fail_code(&f);
        }
    }
    if ops.is_empty() {
        return ncclSuccess;
    }
    launch(ops)
}

/// `ncclGroupSimulateEnd`: closes the group like `ncclGroupEnd` but runs nothing: the
/// outermost close drops the recorded operations (NCCL only estimates their time). Returns
/// the number of operations dropped.
pub fn simulate_end() -> Result<usize, ncclResult_t> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            crate::set_last_error("ncclGroupSimulateEnd without ncclGroupStart");
            return Err(ncclInvalidUsage);
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(0);
        }
        // Communicators initialised inside the group still initialise (their peers wait).
        g.inits.clear();
        g.error = ncclSuccess;
        Ok(std::mem::take(&mut g.ops).len())
    })
}

/// Launches `ops` as one task: the main kernel on the first operation's stream, join kernels
/// on the others.
pub fn launch(ops: Vec<Op>) -> ncclResult_t {
    for op in &ops {
        if let Err(f) = op.comm.wait_ready() {
            return fail_code(&f);
        }
    }
    let _l = lock(&LAUNCH);
    let comms: Vec<Arc<Comm>> = ops.iter().map(|o| o.comm.clone()).collect();
    let mut task = Task::new(ops);
    let streams = task.streams();
    // A captured collective runs only when its graph is launched (maybe never, maybe many
    // times): it takes its place in the communicator's order at each launch, not now, so that
    // eager operations issued between capture and launch do not wait for it, and those issued
    // after a launch come after it (the same stream runs them after the replay).
    let captured = streams.iter().any(|s| is_capturing(*s as cudaStream_t));
    if captured {
        task.set_captured();
    } else {
        task.assign_seqs();
    }
    let task = Arc::new(task);
    let mut joins = 0;
    let mut launch_err = cudaSuccess;
    for &s in &streams[1..] {
        let t = task.clone();
        let mut run = 0u64;
        let rc = sim_device::launch(s as cudaStream_t, move || {
            let r = t.run_join(run);
            run += 1;
            r
        });
        if rc == cudaSuccess {
            joins += 1;
        } else {
            launch_err = rc;
        }
    }
    task.set_joins(joins);
    let t = task.clone();
    let mut run = 0u64;
    let main = move || {
        let r = t.run_main(run);
        run += 1;
        r
    };
    let rc = if captured {
        let t = task.clone();
        sim_device::launch_graphable(streams[0] as cudaStream_t, main, move || t.launched())
    } else {
        sim_device::launch(streams[0] as cudaStream_t, main)
    };
    if rc != cudaSuccess {
        launch_err = rc;
    }
    if launch_err != cudaSuccess {
        // The sequence numbers are spent: the communicators cannot go on.
        let f = Fail::System(format!("kernel launch failed with cudaError {launch_err}"));
        for c in &comms {
            c.fail(&f);
        }
        crate::set_last_error(&format!("{f}"));
        return ncclUnhandledCudaError;
    }
    ncclSuccess
}

/// Whether `stream` is being captured into a graph, asked of the runtime through a handle
/// lookup (like NCCL's own, statically linked, query: invisible to interposers).
fn is_capturing(stream: cudaStream_t) -> bool {
    type IsCapturingFn =
        unsafe extern "C" fn(cudaStream_t, *mut cudaStreamCaptureStatus) -> cudaError_t;
    static F: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let addr = *F.get_or_init(|| {
        sim_device::runtime_symbol(c"cudaStreamIsCapturing").map_or(0, |p| p as usize)
    });
    if addr == 0 {
        return false;
    }
    // SAFETY: the runtime's cudaStreamIsCapturing has this signature.
    let f = unsafe { std::mem::transmute::<usize, IsCapturingFn>(addr) };
    let mut status: cudaStreamCaptureStatus = cudaStreamCaptureStatusNone;
    // SAFETY: a query with a valid output pointer.
    let rc = unsafe { f(stream, &mut status) };
    rc == cudaSuccess && status == cudaStreamCaptureStatusActive
}
