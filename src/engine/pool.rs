//! The bounded pool of I/O threads that runs the prefetch jobs: a fixed set of threads fed by a
//! bounded queue, where submitting never blocks (a full queue hands the job back). The threads
//! start with the first job: an engine opened and closed without one (an `stfs.open` handle of a
//! local file whose tensors are mapped, never read through the engine) starts and joins none.

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use crate::util::lock;

/// A job's handler, shared by the threads.
type Handler<J> = Arc<dyn Fn(J) + Send + Sync>;

/// A fixed set of threads running jobs from a bounded queue; submitting never blocks.
pub(crate) struct IoPool<J: Send + 'static> {
    jobs: Option<SyncSender<J>>,
    threads: usize,
    /// The queue's end and the handler, until the threads are started with them.
    unstarted: Mutex<Option<(Receiver<J>, Handler<J>)>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// Set once the threads were started: whether any runs.
    running: OnceLock<bool>,
}

impl<J: Send + 'static> IoPool<J> {
    /// A pool of `threads` threads, started with the first job, that run `handler` on each job;
    /// at most `queue_len` jobs wait.
    pub(crate) fn start<F>(threads: usize, queue_len: usize, handler: F) -> IoPool<J>
    where
        F: Fn(J) + Send + Sync + 'static,
    {
        let (sender, receiver) = mpsc::sync_channel(queue_len);
        let handler: Handler<J> = Arc::new(handler);
        IoPool {
            jobs: (threads > 0).then_some(sender),
            threads,
            unstarted: Mutex::new(Some((receiver, handler))),
            workers: Mutex::new(Vec::new()),
            running: OnceLock::new(),
        }
    }

    /// Queues `job`; hands it back if the queue is full or there are no threads.
    pub(crate) fn try_submit(&self, job: J) -> Result<(), J> {
        let Some(jobs) = &self.jobs else {
            return Err(job);
        };
        if !self.started() {
            return Err(job);
        }
        jobs.try_send(job).map_err(|e| match e {
            mpsc::TrySendError::Full(job) | mpsc::TrySendError::Disconnected(job) => job,
        })
    }

    /// Starts the threads, once; false if none could be started.
    fn started(&self) -> bool {
        *self.running.get_or_init(|| {
            let mut workers = lock(&self.workers);
            if let Some((receiver, handler)) = lock(&self.unstarted).take() {
                let receiver = Arc::new(Mutex::new(receiver));
                for n in 0..self.threads {
                    let (receiver, handler) = (Arc::clone(&receiver), Arc::clone(&handler));
                    let spawned = std::thread::Builder::new()
                        .name(format!("stfs-io-{n}"))
                        .spawn(move || run_jobs(&receiver, &*handler));
                    match spawned {
                        Ok(worker) => workers.push(worker),
                        Err(e) => log::warn!("cannot start I/O thread: {e}"),
                    }
                }
            }
            !workers.is_empty()
        })
    }
}

impl<J: Send + 'static> Drop for IoPool<J> {
    /// Closes the queue; each thread finishes the queued jobs (the handler should cut them short
    /// once shutdown is flagged) and is joined.
    fn drop(&mut self) {
        self.jobs = None;
        for worker in lock(&self.workers).drain(..) {
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
        assert!(lock(&pool.workers).is_empty(), "no thread before the first job");
        for n in 1..=4 {
            assert!(pool.try_submit(n).is_ok());
        }
        assert_eq!(lock(&pool.workers).len(), 2);
        drop(pool);
        assert_eq!(done.load(Relaxed), 10, "every queued job ran before the threads were joined");
        let idle = IoPool::start(0, 8, |_: usize| {});
        assert_eq!(idle.try_submit(1), Err(1));
    }
}
