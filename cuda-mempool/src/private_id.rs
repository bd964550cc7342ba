//! [`PrivatePoolId`], the name of a private pool: a leaf, so that the history can name
//! private pools without knowing the pool.

/// The id of a private pool: memory that only allocations into the same private pool
/// reuse, released as a whole. The driver layer gives each graph capture its own, in a
/// range of ids reserved for it (those with [`PrivatePoolId::CAPTURE_BIT`] set), which the
/// public [`MemoryPool::retain_private_pool`](crate::MemoryPool::retain_private_pool) and [`MemoryPool::malloc_private`](crate::MemoryPool::malloc_private) refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrivatePoolId(pub u64);

impl PrivatePoolId {
    /// The bit that marks the private pools of graph captures (the driver layer's, id
    /// `CAPTURE_BIT | capture id`). A capture's graph replays into its pool's memory until
    /// the graph is destroyed, so only the capture's own allocations may use or hold it:
    /// an outside hold released twice, or an outside allocation reusing a block the capture
    /// freed, would let the pool lend memory a graph still writes.
    pub const CAPTURE_BIT: u64 = 1 << 63;

    /// The private pool of graph capture `capture`.
    pub(crate) fn of_capture(capture: u64) -> PrivatePoolId {
        PrivatePoolId(capture | Self::CAPTURE_BIT)
    }

    /// Whether this id is in the range reserved for graph captures.
    pub fn is_capture_pool(self) -> bool {
        self.0 & Self::CAPTURE_BIT != 0
    }
}
