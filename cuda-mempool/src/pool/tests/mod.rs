//! The pool's CPU tests on the simulated backend, by concept (one file each); the helpers
//! they share are here.

use super::*;
use crate::sim::{SimCall, SimDevice, SimulatedBackend};
use crate::stats::Stats;

const MIB: usize = 1 << 20;
const S0: StreamKey = StreamKey(10);
const S1: StreamKey = StreamKey(11);
const S2: StreamKey = StreamKey(12);
const D0: DeviceId = DeviceId(0);

fn vm_pool(capacity: usize, page: usize) -> MemoryPool<SimulatedBackend> {
    MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: capacity as u64,
        granularity: Some(page as u64),
    }]))
    .expect("pool")
}

/// A pool that never steals ([`PoolConfig::steal_before_growing`] off): cross-stream reuse
/// only after completed fences.
fn vm_pool_no_steal(capacity: usize, page: usize) -> MemoryPool<SimulatedBackend> {
    let config = PoolConfig {
        steal_before_growing: false,
        ..PoolConfig::default()
    };
    MemoryPool::with_config(
        SimulatedBackend::new(vec![SimDevice {
            total_memory: capacity as u64,
            granularity: Some(page as u64),
        }]),
        config,
    )
    .expect("pool")
}

fn plain_pool(capacity: usize) -> MemoryPool<SimulatedBackend> {
    MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: capacity as u64,
        granularity: None,
    }]))
    .expect("pool")
}

mod accounting;
mod alloc;
mod lifecycle;
mod lingering;
mod pages;
mod per_thread;
mod races;
mod reuse;
mod review;
mod stealing;
mod stress;
