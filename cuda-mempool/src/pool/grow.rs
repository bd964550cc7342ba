//! Growing a shard for a request: a free block, or a new address range or plain segment,
//! with the pages under it mapped.

use crate::backend::Backend;
use crate::error::{OomCause, PoolError};
use crate::policy::{self, size_class};

use super::shard::{Choice, ShardState};
use super::table::Shard;
use super::{Device, Global, MemoryPool};

impl<B: Backend> MemoryPool<B> {
    /// Serves a request from the cache, mapping pages or adding a segment as needed.
    /// `Ok(Err(cause))` when memory is short. Device lock and shard lock held.
    pub(super) fn grow(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
        rounded: u64,
        last_resort: bool,
    ) -> Result<Result<u32, OomCause>, PoolError> {
        let (id, unmapped) = match st.choose_block(rounded) {
            Choice::Ready(id) => return Ok(Ok(id)),
            Choice::Fit { id, addr, unmapped } => (st.claim(id, addr, rounded), unmapped),
            Choice::None => match dev.page {
                Some(page) => {
                    let size = policy::address_range_size(rounded, dev.info.total_memory, page)
                        .ok_or(PoolError::SizeOverflow { size: rounded })?;
                    let base = self
                        .backend
                        .reserve_address_range(dev.id, size)
                        .map_err(PoolError::backend("reserve_address_range"))?;
                    let Some(base) = base else {
                        return Ok(Err(OomCause::AddressSpace));
                    };
                    let first = st.add_segment(base.0, size, size_class(rounded));
                    let unmapped = rounded.div_ceil(page) as usize;
                    (st.claim(first, base.0, rounded), unmapped)
                }
                None => {
                    let seg_size = policy::plain_segment_size(rounded, last_resort)
                        .ok_or(PoolError::SizeOverflow { size: rounded })?;
                    let base = match self.allocate_plain(dev, g, shard, st, seg_size)? {
                        Ok(base) => base,
                        Err(cause) => return Ok(Err(cause)),
                    };
                    let first = st.add_segment(base.0, seg_size, size_class(rounded));
                    (st.claim(first, base.0, rounded), 0)
                }
            },
        };
        if unmapped == 0 {
            return Ok(Ok(id));
        }
        if let Err(cause) = self.provide_pages(dev, g, shard, st, unmapped)? {
            st.unclaim(id);
            return Ok(Err(cause));
        }
        match st.map_block(&self.backend, id, &mut g.spare) {
            Ok(true) => Ok(Ok(id)),
            Ok(false) => {
                st.unclaim(id);
                Ok(Err(OomCause::DeviceMemory))
            }
            Err(e) => {
                st.unclaim(id);
                Err(e)
            }
        }
    }
}
