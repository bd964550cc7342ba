//! What a shard holds, as history events: the baseline a recording starts from.

use crate::backend::{Backend, DeviceAddress, StreamKey};
use crate::history::{EventKind, Recorder};
use crate::pool::PrivatePoolId;

use super::{Backing, BlockState, ShardState};

impl<B: Backend> ShardState<B> {
    /// Records this shard's segments (a plain segment; or a reserved range, then a created
    /// and mapped page for each page mapped in it) and its live blocks, as if they had
    /// just been made: where a recording started on a live pool begins.
    pub(crate) fn record_baseline(&self, rec: &Recorder) {
        let none = DeviceAddress(0);
        for seg in self.segments.iter().flatten() {
            match &seg.backing {
                Backing::Plain => {
                    let base = DeviceAddress(seg.base);
                    rec.event(
                        EventKind::SegmentAlloc,
                        self.device,
                        None,
                        seg.size,
                        base,
                        None,
                    );
                }
                Backing::Virtual(table) => {
                    let base = DeviceAddress(seg.base);
                    rec.event(
                        EventKind::RangeReserve,
                        self.device,
                        None,
                        seg.size,
                        base,
                        None,
                    );
                    let slots = seg.size.div_ceil(self.page.max(1)) as usize;
                    for i in (0..slots).filter(|&i| table.is_mapped(i)) {
                        let at = DeviceAddress(seg.base + i as u64 * self.page);
                        rec.event(
                            EventKind::PageCreate,
                            self.device,
                            None,
                            self.page,
                            none,
                            None,
                        );
                        rec.event(EventKind::PageMap, self.device, None, self.page, at, None);
                    }
                }
            }
        }
        for b in self.blocks.iter().filter(|b| b.state == BlockState::Live) {
            // A lent block is its borrower's: the first of its extra streams.
            let stream = match (b.lent, b.extra_streams.first()) {
                (true, Some((k, _))) => *k,
                _ => self.key,
            };
            self.record_live(rec, stream, b.requested, b.addr);
        }
    }

    /// Records that each live block of this (private) shard belongs to private pool `id`,
    /// after [`record_baseline`](Self::record_baseline) has recorded their mallocs.
    pub(crate) fn record_private_blocks(&self, rec: &Recorder, id: PrivatePoolId) {
        for b in self.blocks.iter().filter(|b| b.state == BlockState::Live) {
            let at = DeviceAddress(b.addr);
            let kind = EventKind::PrivateBlock(id);
            rec.event(kind, self.device, Some(self.key), b.requested, at, None);
        }
    }

    fn record_live(&self, rec: &Recorder, stream: StreamKey, requested: u64, addr: u64) {
        let at = DeviceAddress(addr);
        // A block made before the recording: its allocating stack is not known (a capture
        // here would name the caller of `start_history`, under every lock of the pool).
        rec.baseline_malloc(self.device, stream, requested, at);
    }
}
