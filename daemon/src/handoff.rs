//! Hand-offs between the collector's threads (a client's reader, its writer, the compression
//! pool) whose waiting side goes to sleep at once. crossbeam's channels spin and then yield
//! the core a few times before they sleep: on the two cores a traced job shares with its
//! collector, that spinning took CPU from the very threads being waited for (a profile of
//! the hidden-64 trainer: a sixth of the writers' CPU in `sched_yield` and spin loops). The
//! locks are std's (a short spin, then the futex): parking_lot's yield the core while they
//! spin, which made the compression threads the job's busiest yielders.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvError, RecvTimeoutError, SendError};

/// Locks `m`; a thread that panicked holding it left the state as consistent as ever (every
/// update under these locks is a single assignment or push).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv`, as [`lock`] does.
fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(PoisonError::into_inner)
}

/// One value handed over once ([`oneshot`]).
enum Once<T> {
    Waiting,
    Sent(T),
    /// Received, or the sender went away without sending.
    Gone,
}

struct OnceInner<T> {
    state: Mutex<Once<T>>,
    ready: Condvar,
}

/// The sending side of a [`oneshot`]: dropping it unsent closes it.
pub(crate) struct OnceSender<T>(Arc<OnceInner<T>>);

/// The receiving side of a [`oneshot`].
pub(crate) struct OnceReceiver<T>(Arc<OnceInner<T>>);

/// A channel for one value.
pub(crate) fn oneshot<T>() -> (OnceSender<T>, OnceReceiver<T>) {
    let inner = Arc::new(OnceInner {
        state: Mutex::new(Once::Waiting),
        ready: Condvar::new(),
    });
    (OnceSender(inner.clone()), OnceReceiver(inner))
}

impl<T> OnceSender<T> {
    /// Hands `v` over (a second value is dropped: one is all the receiver takes).
    pub(crate) fn send(&self, v: T) {
        let mut s = lock(&self.0.state);
        if matches!(*s, Once::Waiting) {
            *s = Once::Sent(v);
            self.0.ready.notify_one();
        }
    }
}

impl<T> Drop for OnceSender<T> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        if matches!(*s, Once::Waiting) {
            *s = Once::Gone;
            self.0.ready.notify_one();
        }
    }
}

impl<T> OnceReceiver<T> {
    /// Waits for the value; an error when the sender went away without sending.
    pub(crate) fn recv(&self) -> Result<T, RecvError> {
        let mut s = lock(&self.0.state);
        loop {
            match std::mem::replace(&mut *s, Once::Gone) {
                Once::Sent(v) => return Ok(v),
                Once::Gone => return Err(RecvError),
                Once::Waiting => {
                    *s = Once::Waiting;
                    s = wait(&self.0.ready, s);
                }
            }
        }
    }
}

/// A bounded FIFO between threads ([`queue`]).
struct QueueInner<T> {
    state: Mutex<QueueState<T>>,
    /// Signalled when an item arrives or the last sender leaves.
    filled: Condvar,
    /// Signalled when an item leaves or the last receiver does.
    emptied: Condvar,
    cap: usize,
}

struct QueueState<T> {
    items: VecDeque<T>,
    senders: usize,
    receivers: usize,
}

/// The sending side of a [`queue`]; the queue closes when the last one is dropped.
pub(crate) struct QueueSender<T>(Arc<QueueInner<T>>);

/// The receiving side of a [`queue`]; several take turns (each item goes to one).
pub(crate) struct QueueReceiver<T>(Arc<QueueInner<T>>);

/// A FIFO of at most `cap` items (at least one).
pub(crate) fn queue<T>(cap: usize) -> (QueueSender<T>, QueueReceiver<T>) {
    let inner = Arc::new(QueueInner {
        state: Mutex::new(QueueState {
            items: VecDeque::new(),
            senders: 1,
            receivers: 1,
        }),
        filled: Condvar::new(),
        emptied: Condvar::new(),
        cap: cap.max(1),
    });
    (QueueSender(inner.clone()), QueueReceiver(inner))
}

impl<T> QueueSender<T> {
    /// Appends `v`, waiting while the queue is full; an error when the receiver is gone.
    pub(crate) fn send(&self, v: T) -> Result<(), SendError<T>> {
        self.push_all(std::iter::once(v), 1)
            .map_err(|mut left| SendError(left.swap_remove(0)))
    }

    /// Appends `items` in order, waking the receivers once for all of them (a receiver
    /// woken per item would often find the next one already queued). Returns the items not
    /// queued when every receiver is gone.
    pub(crate) fn send_all(&self, items: Vec<T>) -> Result<(), Vec<T>> {
        let n = items.len();
        self.push_all(items.into_iter(), n)
    }

    /// [`QueueSender::send_all`] of the `n` items of `items`; what is handed back is never
    /// empty (it holds the item that could not be queued).
    fn push_all(&self, mut items: impl Iterator<Item = T>, n: usize) -> Result<(), Vec<T>> {
        let q = &*self.0;
        let mut s = lock(&q.state);
        while let Some(v) = items.next() {
            while s.receivers > 0 && s.items.len() >= q.cap {
                q.filled.notify_all();
                s = wait(&q.emptied, s);
            }
            if s.receivers == 0 {
                return Err(std::iter::once(v).chain(items).collect());
            }
            s.items.push_back(v);
        }
        match n {
            0 => {}
            1 => {
                q.filled.notify_one();
            }
            _ => {
                q.filled.notify_all();
            }
        }
        Ok(())
    }
}

impl<T> Clone for QueueSender<T> {
    fn clone(&self) -> Self {
        lock(&self.0.state).senders += 1;
        QueueSender(self.0.clone())
    }
}

impl<T> Drop for QueueSender<T> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.senders -= 1;
        if s.senders == 0 {
            self.0.filled.notify_all();
        }
    }
}

impl<T> QueueReceiver<T> {
    /// The next item, waiting for one; an error once the queue is empty and every sender gone.
    pub(crate) fn recv(&self) -> Result<T, RecvError> {
        self.recv_until(None).map_err(|_| RecvError)
    }

    /// [`QueueReceiver::recv`] waiting at most `timeout`.
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_until(Some(Instant::now() + timeout))
    }

    fn recv_until(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let q = &*self.0;
        let mut s = lock(&q.state);
        loop {
            if let Some(v) = s.items.pop_front() {
                q.emptied.notify_one();
                return Ok(v);
            }
            if s.senders == 0 {
                return Err(RecvTimeoutError::Disconnected);
            }
            match deadline {
                None => s = wait(&q.filled, s),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(RecvTimeoutError::Timeout);
                    }
                    s = q
                        .filled
                        .wait_timeout(s, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// Whether nothing is queued now.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.0.state).items.is_empty()
    }
}

impl<T> Clone for QueueReceiver<T> {
    fn clone(&self) -> Self {
        lock(&self.0.state).receivers += 1;
        QueueReceiver(self.0.clone())
    }
}

impl<T> Drop for QueueReceiver<T> {
    /// The last receiver gone (the compression threads died), what is queued is dropped at
    /// once: a job's result channel then closes and its writer stores the tensor raw,
    /// instead of waiting for a job nobody will run.
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.receivers -= 1;
        if s.receivers == 0 {
            let left = std::mem::take(&mut s.items);
            drop(s);
            self.0.emptied.notify_all();
            drop(left);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_oneshot_delivers_its_value_once_and_a_dropped_sender_closes_it() {
        let (tx, rx) = oneshot();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send(7u32);
            tx.send(8);
        });
        assert_eq!(
            rx.recv(),
            Ok(7),
            "the receiver sleeps until the value comes"
        );
        assert_eq!(rx.recv(), Err(RecvError), "one value only");
        t.join().expect("sender");
        let (tx, rx) = oneshot::<u32>();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(tx);
        });
        assert_eq!(
            rx.recv(),
            Err(RecvError),
            "a sender gone unsent wakes the receiver"
        );
        t.join().expect("sender");
    }

    #[test]
    fn a_queue_keeps_order_bounds_its_length_ends_after_its_last_sender_and_drops_what_nobody_takes(
    ) {
        let (tx, rx) = queue(2);
        let tx2 = tx.clone();
        let t = std::thread::spawn(move || {
            for i in 0..100u32 {
                tx2.send(i).expect("receiver alive");
            }
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(5)).ok(),
            Some(0),
            "an item within the timeout"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            lock(&rx.0.state).items.len() <= 2,
            "a full queue holds the sender"
        );
        for i in 1..100 {
            assert_eq!(rx.recv(), Ok(i));
        }
        t.join().expect("sender");
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(5)),
            Err(RecvTimeoutError::Timeout),
            "a sender is left"
        );
        assert!(rx.is_empty());
        drop(tx);
        assert_eq!(
            rx.recv(),
            Err(RecvError),
            "closed once every sender is gone"
        );
        let (tx, rx) = queue::<OnceSender<u32>>(4);
        let (once, waiting) = oneshot();
        tx.send(once).expect("queued");
        drop(rx);
        assert_eq!(
            waiting.recv(),
            Err(RecvError),
            "what was queued for a receiver that is gone is dropped, not left waiting"
        );
        let (tx, rx) = queue::<u32>(1);
        drop(rx);
        assert!(tx.send(1).is_err(), "nobody receives");
        assert_eq!(tx.send_all(vec![2, 3]), Err(vec![2, 3]), "handed back");
    }

    #[test]
    fn items_sent_together_reach_several_receivers_in_order() {
        let (tx, rx) = queue::<u32>(4);
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Ok(v) = rx.recv() {
                        got.push(v);
                    }
                    got
                })
            })
            .collect();
        drop(rx);
        for round in 0..50u32 {
            tx.send_all((0..10).map(|i| round * 10 + i).collect())
                .expect("receivers alive");
        }
        drop(tx);
        let mut all: Vec<u32> = Vec::new();
        for w in workers {
            let got = w.join().expect("worker");
            assert!(
                got.windows(2).all(|p| p[0] < p[1]),
                "each takes them in order"
            );
            all.extend(got);
        }
        all.sort_unstable();
        assert_eq!(
            all,
            (0..500).collect::<Vec<_>>(),
            "each item to one receiver"
        );
    }
}
