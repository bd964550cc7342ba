//! CPU tests: the rendezvous over loopback, the loader with no library, input checks that
//! need no GPU.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::thread;
use std::time::{Duration, Instant};

use cudars_nccl::rendezvous::{exchange_id, free_port, JobEnv, RendezvousError, Scheme};
use cudars_nccl::{Error, UniqueId};

fn job(rank: usize, world_size: usize, port: u16) -> JobEnv {
    JobEnv {
        rank,
        world_size,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        scheme: Scheme::Torchrun,
    }
}

fn test_id() -> UniqueId {
    let mut b = [0u8; 128];
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    UniqueId::from_bytes(b)
}

fn rendezvous_error(r: Result<UniqueId, Error>) -> RendezvousError {
    match r {
        Err(Error::Rendezvous(e)) => e,
        other => panic!("expected a rendezvous error, got {other:?}"),
    }
}

#[test]
fn every_rank_gets_rank_zeros_id_whoever_starts_first() {
    let port = free_port().unwrap();
    let world = 4;
    let timeout = Duration::from_secs(20);
    // Peers start before the root: they must retry until it listens.
    let peers: Vec<_> = (1..world)
        .map(|r| {
            thread::spawn(move || exchange_id(&job(r, world, port), timeout, || unreachable!()))
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let root = exchange_id(&job(0, world, port), timeout, || Ok(test_id())).unwrap();
    assert_eq!(root, test_id());
    for p in peers {
        assert_eq!(p.join().unwrap().unwrap(), test_id());
    }
}

#[test]
fn a_peer_that_never_comes_is_a_typed_timeout_on_the_root() {
    let port = free_port().unwrap();
    let timeout = Duration::from_millis(700);
    let peer = thread::spawn(move || {
        exchange_id(&job(1, 3, port), Duration::from_secs(10), || unreachable!())
    });
    let start = Instant::now();
    let e = rendezvous_error(exchange_id(&job(0, 3, port), timeout, || Ok(test_id())));
    assert!(start.elapsed() < timeout + Duration::from_secs(2));
    match e {
        RendezvousError::PeerNeverCame {
            missing,
            world_size,
            ..
        } => {
            assert_eq!(missing, vec![2]);
            assert_eq!(world_size, 3);
        }
        other => panic!("{other:?}"),
    }
    // The rank that did come is told why, instead of waiting for its own timeout.
    let e = rendezvous_error(peer.join().unwrap());
    assert!(
        matches!(&e, RendezvousError::Rejected { reason } if reason.contains("never reached")),
        "{e}"
    );
}

#[test]
fn a_root_that_never_comes_is_a_typed_timeout_on_the_peer() {
    let port = free_port().unwrap();
    let timeout = Duration::from_millis(500);
    let start = Instant::now();
    let e = rendezvous_error(exchange_id(&job(1, 2, port), timeout, || unreachable!()));
    assert!(start.elapsed() >= timeout);
    assert!(start.elapsed() < timeout + Duration::from_secs(3));
    assert!(matches!(e, RendezvousError::RootUnreachable { .. }), "{e}");
}

#[test]
fn a_wrong_world_size_is_refused_on_both_sides() {
    let port = free_port().unwrap();
    let t = Duration::from_secs(10);
    let peer = thread::spawn(move || exchange_id(&job(1, 3, port), t, || unreachable!()));
    let e = rendezvous_error(exchange_id(&job(0, 2, port), t, || Ok(test_id())));
    assert!(
        matches!(
            e,
            RendezvousError::WrongWorldSize {
                rank: 1,
                expected: 2,
                got: 3
            }
        ),
        "{e}"
    );
    let e = rendezvous_error(peer.join().unwrap());
    assert!(
        matches!(&e, RendezvousError::Rejected { reason } if reason.contains("world")),
        "{e}"
    );
}

#[test]
fn a_duplicate_rank_is_refused() {
    let port = free_port().unwrap();
    let t = Duration::from_secs(10);
    let a = thread::spawn(move || exchange_id(&job(1, 3, port), t, || unreachable!()));
    let b = thread::spawn(move || exchange_id(&job(1, 3, port), t, || unreachable!()));
    let e = rendezvous_error(exchange_id(&job(0, 3, port), t, || Ok(test_id())));
    assert!(
        matches!(e, RendezvousError::DuplicateRank { rank: 1 }),
        "{e}"
    );
    for h in [a, b] {
        let e = rendezvous_error(h.join().unwrap());
        assert!(matches!(e, RendezvousError::Rejected { .. }), "{e}");
    }
}

#[test]
fn a_single_rank_job_needs_no_network() {
    let id = exchange_id(&job(0, 1, 1), Duration::from_millis(1), || Ok(test_id())).unwrap();
    assert_eq!(id, test_id());
}

#[test]
fn no_library_is_a_typed_error_naming_the_variable() {
    // This test binary never had NCCL on its loader path in CI; where it has, skip nothing but
    // check the other branch: the library answers with a version.
    match cudars_nccl::version() {
        Err(Error::Load(e)) => {
            let text = e.to_string();
            assert!(text.contains("CUDA_NCCL_LIBRARY"), "{text}");
            assert!(text.contains("libnccl.so.2"), "{text}");
            assert!(!cudars_nccl::is_available());
        }
        Ok((major, _, _)) => assert!(major >= 2),
        Err(other) => panic!("unexpected error: {other}"),
    }
}
