//! Growing a shard for a request: a free block, or a new address range or plain segment,
//! with the pages under it mapped.

use crate::backend::Backend;
use crate::error::{OomCause, PoolError};
use crate::policy::{self, size_class};

use super::shard::Choice;
use super::{Held, MemoryPool};

impl<B: Backend> MemoryPool<B> {
    /// Serves a request from the cache, mapping pages or adding a segment as needed.
    /// `Ok(Err(cause))` when memory is short.
    pub(super) fn grow(
        &self,
        h: &mut Held<'_, '_, B>,
        rounded: u64,
        last_resort: bool,
    ) -> Result<Result<u32, OomCause>, PoolError> {
        let dev = h.dev;
        let (id, unmapped) = match h.st.choose_block(rounded) {
            Choice::Ready(id) => return Ok(Ok(id)),
            Choice::Fit { id, addr, unmapped } => (h.st.claim(id, addr, rounded), unmapped),
            Choice::None => match dev.page {
                Some(page) => {
                    let size = policy::address_range_size(rounded, dev.info.total_memory, page)
                        .ok_or_else(|| PoolError::SizeOverflow {
                            size: rounded as usize,
                        })?;
                    let base = self
                        .backend
                        .reserve_address_range(dev.id, size)
                        .map_err(PoolError::backend("reserve_address_range"))?;
                    let Some(base) = base else {
                        return Ok(Err(OomCause::AddressSpace));
                    };
                    let first = h.st.add_segment(base.0, size, size_class(rounded));
                    let unmapped = rounded.div_ceil(page) as usize;
                    (h.st.claim(first, base.0, rounded), unmapped)
                }
                None => {
                    let seg_size = policy::plain_segment_size(rounded, last_resort).ok_or(
                        PoolError::SizeOverflow {
                            size: rounded as usize,
                        },
                    )?;
                    let base = match self.allocate_plain(h, seg_size)? {
                        Ok(base) => base,
                        Err(cause) => return Ok(Err(cause)),
                    };
                    let first = h.st.add_segment(base.0, seg_size, size_class(rounded));
                    (h.st.claim(first, base.0, rounded), 0)
                }
            },
        };
        if unmapped == 0 {
            return Ok(Ok(id));
        }
        if let Err(cause) = self.provide_pages(h, unmapped)? {
            h.st.unclaim(id);
            return Ok(Err(cause));
        }
        match h.st.map_block(&self.backend, id, &mut h.g.spare) {
            Ok(true) => Ok(Ok(id)),
            Ok(false) => {
                h.st.unclaim(id);
                Ok(Err(OomCause::DeviceMemory))
            }
            Err(e) => {
                h.st.unclaim(id);
                Err(e)
            }
        }
    }
}
