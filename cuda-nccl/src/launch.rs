//! [`Launcher`]: starts N local processes of one program with the torchrun variables set
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), the
//! way a multi-node job starts, on one host. A program usually re-executes itself: without
//! `RANK` it launches, with `RANK` it is a rank ([`Communicator::from_env`]).
//!
//! Every process gets `NCCL_NVLS_ENABLE=0` unless [`Launcher::env`] says otherwise: NVLink
//! multicast stays off on the machines this workspace is tested on.
//!
//! [`Communicator::from_env`]: crate::Communicator::from_env

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::rendezvous::free_port;

/// Starts `world_size` local ranks of a program.
///
/// ```no_run
/// use std::time::Duration;
/// use cudars_nccl::Launcher;
/// if std::env::var_os("RANK").is_none() {
///     // The launcher: this same program, once per GPU.
///     let n = cudars_core::device_count()?;
///     let statuses = Launcher::new(n).spawn()?.wait(Duration::from_secs(300))?;
///     assert!(statuses.iter().all(|s| s.success()));
/// } else {
///     let (comm, _job) = cudars_nccl::Communicator::from_env(&Default::default())?;
///     // ... collectives ...
/// }
/// # Ok::<(), cudars_nccl::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Launcher {
    world_size: usize,
    program: Option<PathBuf>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    master_port: Option<u16>,
}

impl Launcher {
    /// `world_size` ranks of the current executable with its own arguments (change with
    /// [`program`](Self::program) and [`args`](Self::args)).
    pub fn new(world_size: usize) -> Launcher {
        Launcher {
            world_size,
            program: None,
            args: std::env::args_os().skip(1).collect(),
            env: Vec::new(),
            master_port: None,
        }
    }

    /// The program to start.
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// Its arguments (replacing the default: this process's own).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// One more environment variable for every rank (applied after the launcher's own).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The rendezvous port (default: a free one).
    pub fn master_port(mut self, port: u16) -> Self {
        self.master_port = Some(port);
        self
    }

    /// Starts every rank.
    pub fn spawn(&self) -> Result<Job> {
        if self.world_size == 0 {
            return Err(Error::InvalidArgument(
                "a job needs at least one rank".into(),
            ));
        }
        let program = match &self.program {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(|source| Error::Io {
                during: "find the current executable",
                source,
            })?,
        };
        let port = match self.master_port {
            Some(p) => p,
            None => free_port()?,
        };
        let mut children = Vec::with_capacity(self.world_size);
        for rank in 0..self.world_size {
            let mut cmd = Command::new(&program);
            cmd.args(&self.args)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", self.world_size.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", self.world_size.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("NCCL_NVLS_ENABLE", "0");
            for (k, v) in &self.env {
                cmd.env(k, v);
            }
            match cmd.spawn() {
                Ok(child) => children.push(child),
                Err(source) => {
                    let mut job = Job { children };
                    job.kill();
                    return Err(Error::Io {
                        during: "start a rank",
                        source,
                    });
                }
            }
        }
        Ok(Job { children })
    }
}

/// Running ranks. Dropping the job kills the ranks still running.
#[derive(Debug)]
pub struct Job {
    children: Vec<Child>,
}

impl Job {
    /// The processes, rank order.
    pub fn children_mut(&mut self) -> &mut [Child] {
        &mut self.children
    }

    /// Waits for every rank, at most `timeout`; on timeout kills the rest and returns
    /// [`Error::Timeout`].
    pub fn wait(mut self, timeout: Duration) -> Result<Vec<ExitStatus>> {
        let start = Instant::now();
        let mut done: Vec<Option<ExitStatus>> = vec![None; self.children.len()];
        loop {
            for (c, d) in self.children.iter_mut().zip(done.iter_mut()) {
                if d.is_none() {
                    *d = c.try_wait().map_err(|source| Error::Io {
                        during: "wait for a rank",
                        source,
                    })?;
                }
            }
            if done.iter().all(Option::is_some) {
                return Ok(done.into_iter().flatten().collect());
            }
            if start.elapsed() >= timeout {
                self.kill();
                return Err(Error::Timeout {
                    what: "the launched ranks",
                    waited: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.kill();
    }
}
