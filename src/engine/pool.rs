//! The bounded pool of I/O threads that runs the prefetch jobs: a fixed set of threads fed by a
//! bounded queue, where submitting never blocks (a full queue hands the job back).

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::util::lock;

/// A fixed set of threads running jobs from a bounded queue; submitting never blocks.
pub(crate) struct IoPool<J: Send + 'static> {
    jobs: Option<SyncSender<J>>,
    workers: Vec<JoinHandle<()>>,
}

impl<J: Send + 'static> IoPool<J> {
    /// Starts `threads` threads that run `handler` on each job; at most `queue_len` jobs wait.
    pub(crate) fn start<F>(threads: usize, queue_len: usize, handler: F) -> IoPool<J>
    where
        F: Fn(J) + Send + Sync + 'static,
    {
        let (sender, receiver) = mpsc::sync_channel(queue_len);
        let receiver = Arc::new(Mutex::new(receiver));
        let handler = Arc::new(handler);
        let workers = (0..threads)
            .filter_map(|n| {
                let (receiver, handler) = (Arc::clone(&receiver), Arc::clone(&handler));
                let spawned = std::thread::Builder::new()
                    .name(format!("stfs-io-{n}"))
                    .spawn(move || run_jobs(&receiver, &*handler));
                spawned.map_err(|e| log::warn!("cannot start I/O thread: {e}")).ok()
            })
            .collect::<Vec<_>>();
        let jobs = (!workers.is_empty()).then_some(sender);
        IoPool { jobs, workers }
    }

    /// Queues `job`; hands it back if the queue is full or there are no threads.
    pub(crate) fn try_submit(&self, job: J) -> Result<(), J> {
        match &self.jobs {
            Some(jobs) => jobs.try_send(job).map_err(|e| match e {
                mpsc::TrySendError::Full(job) | mpsc::TrySendError::Disconnected(job) => job,
            }),
            None => Err(job),
        }
    }
}

impl<J: Send + 'static> Drop for IoPool<J> {
    /// Closes the queue; each thread finishes the queued jobs (the handler should cut them short
    /// once shutdown is flagged) and is joined.
    fn drop(&mut self) {
        self.jobs = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn run_jobs<J>(receiver: &Mutex<Receiver<J>>, handler: &dyn Fn(J)) {
    loop {
        let job = lock(receiver).recv();
        match job {
            Ok(job) => handler(job),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    #[test]
    fn pool_runs_jobs_and_joins_on_drop() {
        let done = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&done);
        let pool = IoPool::start(2, 8, move |n: usize| {
            counter.fetch_add(n, Relaxed);
        });
        for n in 1..=4 {
            assert!(pool.try_submit(n).is_ok());
        }
        drop(pool);
        assert_eq!(done.load(Relaxed), 10, "every queued job ran before the threads were joined");
        let idle = IoPool::start(0, 8, |_: usize| {});
        assert_eq!(idle.try_submit(1), Err(1));
    }
}
