//! Rendezvous for multi-process and multi-node jobs: who am I ([`JobEnv`], from the variables
//! torchrun, Slurm or Open MPI set), and the [`UniqueId`] handed from rank 0 to every other
//! rank over TCP ([`exchange_id`]), with a deadline and clear errors: a peer with another world
//! size, two peers claiming one rank, a peer that never comes, a root that cannot be reached.
//!
//! The protocol is one round: each rank `r > 0` connects to `MASTER_ADDR:MASTER_PORT` and
//! sends `CRSNCCL1`, its rank and the world size it believes in (little-endian `u32`s); once
//! every rank has checked in, rank 0 answers each with status 0 and the 128 id bytes, or with
//! status 1 and the reason it refuses (`u32` length + UTF-8).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::comm::{CommConfig, Communicator};
use crate::error::{Error, Result};
use crate::id::{UniqueId, UNIQUE_ID_BYTES};

const MAGIC: &[u8; 8] = b"CRSNCCL1";

/// Which convention the job's variables followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (torchrun, and this crate's [`Launcher`](crate::Launcher)).
    Torchrun,
    /// `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`.
    Slurm,
    /// `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`.
    OpenMpi,
}

/// Where this process sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnv {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks in the job.
    pub world_size: usize,
    /// Rank on this node: the GPU ordinal to use.
    pub local_rank: usize,
    /// Where rank 0 listens (`MASTER_ADDR`).
    pub master_addr: String,
    /// Its port (`MASTER_PORT`).
    pub master_port: u16,
    /// The convention the variables followed.
    pub scheme: Scheme,
}

pub use crate::error::RendezvousError;

impl JobEnv {
    /// Reads the process environment: torchrun's variables first, then Slurm's, then Open
    /// MPI's; `MASTER_ADDR` and `MASTER_PORT` in every case.
    ///
    /// ```no_run
    /// let job = cudars_nccl::JobEnv::from_env()?;
    /// println!("rank {} of {} on GPU {}", job.rank, job.world_size, job.local_rank);
    /// # Ok::<(), cudars_nccl::RendezvousError>(())
    /// ```
    pub fn from_env() -> Result<JobEnv, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) over any variable lookup (for tests and for launchers that
    /// hold the variables in a map).
    ///
    /// ```
    /// use cudars_nccl::rendezvous::{JobEnv, Scheme};
    /// let vars = [("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1"),
    ///             ("MASTER_ADDR", "node0"), ("MASTER_PORT", "29500")];
    /// let job = JobEnv::from_lookup(|k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string()))?;
    /// assert_eq!((job.rank, job.world_size, job.local_rank, job.scheme), (3, 8, 1, Scheme::Slurm));
    /// # Ok::<(), cudars_nccl::RendezvousError>(())
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<JobEnv, RendezvousError> {
        let (scheme, rank_var, size_var, local_var) = if lookup("RANK").is_some() {
            (Scheme::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK")
        } else if lookup("SLURM_PROCID").is_some() {
            (
                Scheme::Slurm,
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
            )
        } else if lookup("OMPI_COMM_WORLD_RANK").is_some() {
            (
                Scheme::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            )
        } else {
            return Err(RendezvousError::MissingVar {
                name: "RANK",
                hint: "set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun, cudars_nccl::Launcher), or run under Slurm or Open MPI",
            });
        };
        let number = |name: &'static str| -> Result<usize, RendezvousError> {
            let value = lookup(name).ok_or(RendezvousError::MissingVar {
                name,
                hint: "the job launcher sets it",
            })?;
            value.trim().parse().map_err(|_| RendezvousError::BadVar {
                name,
                value,
                why: "not a non-negative integer",
            })
        };
        let rank = number(rank_var)?;
        let world_size = number(size_var)?;
        let local_rank = match lookup(local_var) {
            Some(_) => number(local_var)?,
            None => rank,
        };
        if world_size == 0 {
            return Err(RendezvousError::BadVar {
                name: size_var,
                value: "0".into(),
                why: "a job has at least one rank",
            });
        }
        if rank >= world_size {
            return Err(RendezvousError::BadVar {
                name: rank_var,
                value: rank.to_string(),
                why: "the rank must be below the world size",
            });
        }
        let master_addr = lookup("MASTER_ADDR").ok_or(RendezvousError::MissingVar {
            name: "MASTER_ADDR",
            hint: "the host of rank 0",
        })?;
        let port = lookup("MASTER_PORT").ok_or(RendezvousError::MissingVar {
            name: "MASTER_PORT",
            hint: "a free TCP port on rank 0's host",
        })?;
        let master_port = port.trim().parse().map_err(|_| RendezvousError::BadVar {
            name: "MASTER_PORT",
            value: port.clone(),
            why: "not a TCP port number",
        })?;
        Ok(JobEnv {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
            scheme,
        })
    }

    /// `MASTER_ADDR:MASTER_PORT`.
    pub fn master(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

/// A TCP port that was free a moment ago on 127.0.0.1 (for local jobs and tests).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind(("127.0.0.1", 0)).map_err(|source| Error::Io {
        during: "bind 127.0.0.1:0",
        source,
    })?;
    let port = l
        .local_addr()
        .map_err(|source| Error::Io {
            during: "local_addr",
            source,
        })?
        .port();
    Ok(port)
}

/// Hands the [`UniqueId`] from rank 0 to every rank of `job`, waiting at most `timeout`.
/// `root_id` is called on rank 0 only (usually [`UniqueId::new`]).
///
/// ```no_run
/// use std::time::Duration;
/// use cudars_nccl::{rendezvous, JobEnv, UniqueId};
/// let job = JobEnv::from_env()?;
/// let id = rendezvous::exchange_id(&job, Duration::from_secs(60), UniqueId::new)?;
/// # Ok::<(), cudars_nccl::Error>(())
/// ```
pub fn exchange_id(
    job: &JobEnv,
    timeout: Duration,
    root_id: impl FnOnce() -> Result<UniqueId>,
) -> Result<UniqueId> {
    if job.rank == 0 {
        let id = root_id()?;
        if job.world_size > 1 {
            serve(job, timeout, &id)?;
        }
        Ok(id)
    } else {
        Ok(fetch(job, timeout)?)
    }
}

fn io_err(during: &str, e: std::io::Error) -> RendezvousError {
    RendezvousError::Protocol(format!("{during}: {e}"))
}

/// Rank 0: accept every other rank, check them, answer with the id or the reason for refusal.
fn serve(job: &JobEnv, timeout: Duration, id: &UniqueId) -> Result<(), RendezvousError> {
    let start = Instant::now();
    let addr = format!("0.0.0.0:{}", job.master_port);
    let listener = TcpListener::bind(&addr).map_err(|source| RendezvousError::Bind {
        addr: addr.clone(),
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("listener", e))?;
    let mut peers: BTreeMap<usize, TcpStream> = BTreeMap::new();
    let outcome = loop {
        if peers.len() == job.world_size - 1 {
            break Ok(());
        }
        if start.elapsed() >= timeout {
            let missing = (1..job.world_size)
                .filter(|r| !peers.contains_key(r))
                .collect();
            break Err(RendezvousError::PeerNeverCame {
                missing,
                world_size: job.world_size,
                waited: timeout,
            });
        }
        let (mut stream, _) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => break Err(io_err("accept", e)),
        };
        let remaining = timeout
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(10));
        let hello = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(remaining.min(Duration::from_secs(10)))))
            .and_then(|()| {
                let mut buf = [0u8; 16];
                stream.read_exact(&mut buf).map(|()| buf)
            });
        let Ok(hello) = hello else {
            // Not a rank of ours (a port scanner, a peer that died while connecting): ignore.
            continue;
        };
        if &hello[..8] != MAGIC {
            let _ = refuse(&mut stream, "not a cuda-nccl rendezvous");
            continue;
        }
        let rank = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]) as usize;
        let size = u32::from_le_bytes([hello[12], hello[13], hello[14], hello[15]]) as usize;
        let problem = if size != job.world_size {
            Some(RendezvousError::WrongWorldSize {
                rank,
                expected: job.world_size,
                got: size,
            })
        } else if rank == 0 || rank >= job.world_size {
            if rank == 0 {
                Some(RendezvousError::DuplicateRank { rank })
            } else {
                Some(RendezvousError::RankOutOfRange {
                    rank,
                    world_size: job.world_size,
                })
            }
        } else if peers.contains_key(&rank) {
            Some(RendezvousError::DuplicateRank { rank })
        } else {
            None
        };
        if let Some(p) = problem {
            let _ = refuse(&mut stream, &p.to_string());
            break Err(p);
        }
        peers.insert(rank, stream);
    };
    match outcome {
        Ok(()) => {
            let mut msg = vec![0u8];
            msg.extend_from_slice(id.as_bytes());
            for (_, mut s) in peers {
                let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
                s.write_all(&msg).map_err(|e| io_err("send the id", e))?;
            }
            Ok(())
        }
        Err(e) => {
            let reason = e.to_string();
            for (_, mut s) in peers {
                let _ = refuse(&mut s, &reason);
            }
            Err(e)
        }
    }
}

fn refuse(stream: &mut TcpStream, reason: &str) -> std::io::Result<()> {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut msg = vec![1u8];
    msg.extend_from_slice(&(reason.len() as u32).to_le_bytes());
    msg.extend_from_slice(reason.as_bytes());
    stream.write_all(&msg)
}

/// Rank > 0: connect (retrying until the deadline: rank 0 may start later), say who we are,
/// read the answer.
fn fetch(job: &JobEnv, timeout: Duration) -> Result<UniqueId, RendezvousError> {
    let start = Instant::now();
    let master = job.master();
    let unreachable = |last: String| RendezvousError::RootUnreachable {
        addr: master.clone(),
        waited: timeout,
        last,
    };
    let mut last = String::from("no attempt");
    let mut stream = loop {
        let remaining = timeout.saturating_sub(start.elapsed());
        if remaining.is_zero() {
            return Err(unreachable(last));
        }
        let attempt = master
            .to_socket_addrs()
            .map_err(|e| e.to_string())
            .and_then(|mut addrs| addrs.next().ok_or_else(|| "no address".to_string()))
            .and_then(|a| {
                TcpStream::connect_timeout(&a, remaining.min(Duration::from_secs(2)))
                    .map_err(|e| e.to_string())
            });
        match attempt {
            Ok(s) => break s,
            Err(e) => {
                last = e;
                std::thread::sleep(Duration::from_millis(50).min(remaining));
            }
        }
    };
    let mut hello = Vec::with_capacity(16);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&(job.rank as u32).to_le_bytes());
    hello.extend_from_slice(&(job.world_size as u32).to_le_bytes());
    stream
        .write_all(&hello)
        .map_err(|e| io_err("send the hello", e))?;
    let remaining = timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(remaining))
        .map_err(|e| io_err("read timeout", e))?;
    let mut status = [0u8; 1];
    stream.read_exact(&mut status).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            unreachable(format!("connected, but no answer: {e}"))
        } else {
            io_err("read the answer", e)
        }
    })?;
    match status[0] {
        0 => {
            let mut id = [0u8; UNIQUE_ID_BYTES];
            stream
                .read_exact(&mut id)
                .map_err(|e| io_err("read the id", e))?;
            Ok(UniqueId::from_bytes(id))
        }
        1 => {
            let mut len = [0u8; 4];
            stream
                .read_exact(&mut len)
                .map_err(|e| io_err("read the refusal", e))?;
            let len = u32::from_le_bytes(len).min(64 * 1024) as usize;
            let mut reason = vec![0u8; len];
            stream
                .read_exact(&mut reason)
                .map_err(|e| io_err("read the refusal", e))?;
            Err(RendezvousError::Rejected {
                reason: String::from_utf8_lossy(&reason).into_owned(),
            })
        }
        other => Err(RendezvousError::Protocol(format!(
            "unknown answer status {other}"
        ))),
    }
}

impl Communicator {
    /// The whole multi-process start: reads [`JobEnv::from_env`], takes GPU `local_rank`,
    /// gets the id from rank 0 ([`exchange_id`], bounded by the config's timeout) and joins
    /// the communicator.
    ///
    /// ```no_run
    /// use cudars_nccl::{CommConfig, Communicator};
    /// let (comm, job) = Communicator::from_env(&CommConfig::default().nonblocking(true))?;
    /// assert_eq!(comm.rank(), job.rank);
    /// # Ok::<(), cudars_nccl::Error>(())
    /// ```
    pub fn from_env(config: &CommConfig) -> Result<(Communicator, JobEnv)> {
        let job = JobEnv::from_env()?;
        let device = cudars_core::Device::new(job.local_rank)?;
        let id = exchange_id(&job, config.get_timeout(), UniqueId::new)?;
        let comm = Communicator::init_rank_with(&device, job.world_size, job.rank, &id, config)?;
        Ok((comm, job))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
    }

    #[test]
    fn torchrun_variables() {
        let vars = [
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let job = JobEnv::from_lookup(lookup(&vars)).unwrap();
        assert_eq!(job.rank, 2);
        assert_eq!(job.world_size, 4);
        assert_eq!(job.local_rank, 0);
        assert_eq!(job.scheme, Scheme::Torchrun);
        assert_eq!(job.master(), "10.0.0.1:29500");
    }

    #[test]
    fn open_mpi_variables_and_local_rank_default() {
        let vars = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "1234"),
        ];
        let job = JobEnv::from_lookup(lookup(&vars)).unwrap();
        assert_eq!((job.rank, job.local_rank), (1, 1));
        assert_eq!(job.scheme, Scheme::OpenMpi);
        assert_eq!(job.master(), "[::1]:1234");
    }

    #[test]
    fn missing_and_bad_variables_are_named() {
        let e = JobEnv::from_lookup(|_| None).unwrap_err();
        assert!(matches!(
            e,
            RendezvousError::MissingVar { name: "RANK", .. }
        ));
        let vars = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")];
        let e = JobEnv::from_lookup(lookup(&vars)).unwrap_err();
        assert!(matches!(
            e,
            RendezvousError::MissingVar {
                name: "MASTER_ADDR",
                ..
            }
        ));
        let vars = [("RANK", "5"), ("WORLD_SIZE", "2")];
        let e = JobEnv::from_lookup(lookup(&vars)).unwrap_err();
        assert!(matches!(e, RendezvousError::BadVar { name: "RANK", .. }));
        let vars = [
            ("RANK", "0"),
            ("WORLD_SIZE", "x"),
            ("MASTER_ADDR", "a"),
            ("MASTER_PORT", "1"),
        ];
        let e = JobEnv::from_lookup(lookup(&vars)).unwrap_err();
        assert!(matches!(
            e,
            RendezvousError::BadVar {
                name: "WORLD_SIZE",
                ..
            }
        ));
        let vars = [
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "a"),
            ("MASTER_PORT", "99999"),
        ];
        let e = JobEnv::from_lookup(lookup(&vars)).unwrap_err();
        assert!(matches!(
            e,
            RendezvousError::BadVar {
                name: "MASTER_PORT",
                ..
            }
        ));
    }
}
