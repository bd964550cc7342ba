//! The data loader: batches packed on the host and uploaded through `cuda-xfer` on a second
//! stream while the model's stream runs the previous step.
//!
//! One step's batch moves in three stages, each ordered by an event rather than by waiting
//! on the host:
//!
//! 1. [`Loader::prefetch`] packs the batch ([`Model::pack_batch`]: the tokens and the
//!    positions grouped by token) into a pinned host buffer, makes the copy stream wait until
//!    the previous batch has left the staging buffer, and queues the upload into the staging
//!    buffer with [`cudars_xfer::copy_to_device_async`];
//! 2. [`Loader::load`] makes the model's stream wait for that upload and copies the staging
//!    buffer into the model's batch buffer (device to device, a few hundred kilobytes);
//! 3. the step (eager, or a replayed graph) reads the batch buffer.
//!
//! So the upload of batch `k + 1` runs while step `k` computes, and the host packs batch
//! `k + 1` meanwhile too. The host buffer comes back from the transfer's
//! [`Pending`] before it is filled again, so the DMA never reads a
//! buffer being written.
//!
//! ```no_run
//! # fn demo(model: &gpt2::model::Model, batches: &[(Vec<i32>, Vec<i32>)]) -> gpt2::Result<()> {
//! use gpt2::loader::Loader;
//! let mut loader = Loader::new(model)?;
//! loader.prefetch(model, &batches[0].0, &batches[0].1)?;
//! for (i, _) in batches.iter().enumerate() {
//!     loader.load(model)?;
//!     if let Some((inp, tgt)) = batches.get(i + 1) {
//!         loader.prefetch(model, inp, tgt)?; // overlaps the step queued below
//!     }
//!     model.forward()?;
//!     model.backward()?;
//!     model.update(&gpt2::model::AdamW::default())?;
//! }
//! # Ok(()) }
//! ```

use cudars_core::{Event, Stream};
use cudars_xfer::{copy_to_device_async, DeviceBuffer, Pending, PinnedBuffer};

use crate::model::Model;
use crate::{Error, Result};

/// Uploads packed batches for one [`Model`] on a stream of its own (see the module).
pub struct Loader {
    copy: Stream,
    staging: DeviceBuffer<i32>,
    /// The host buffer, when no upload holds it.
    host: Option<PinnedBuffer<i32>>,
    /// The upload in flight, holding the host buffer.
    inflight: Option<Pending<PinnedBuffer<i32>>>,
    /// Recorded on the copy stream after each upload.
    uploaded: Event,
    /// Recorded on the model's stream after each copy out of the staging buffer.
    consumed: Event,
    /// A batch is in the staging buffer (or on its way) and not yet loaded.
    ready: bool,
    words: usize,
}

impl Loader {
    /// A loader for `model`'s batches: a copy stream on its device, a staging buffer in the
    /// default pool and a pinned host buffer.
    pub fn new(model: &Model) -> Result<Loader> {
        let dev = model.stream().device();
        let words = model.batch_words();
        let copy = Stream::new(&dev)?;
        let staging = cudars_mempool::driver::malloc(&copy, words * 4)?;
        Ok(Loader {
            staging: DeviceBuffer::from_ptr(staging).map_err(xfer)?,
            host: Some(PinnedBuffer::zeroed(&dev, words).map_err(xfer)?),
            inflight: None,
            uploaded: Event::new(&dev)?,
            consumed: Event::new(&dev)?,
            ready: false,
            words,
            copy,
        })
    }

    /// Packs the next batch on the host and queues its upload on the copy stream, after the
    /// previous batch has been loaded out of the staging buffer. Refused (nothing queued)
    /// while a batch waits to be [`load`](Self::load)ed, for a model of another batch size,
    /// or for tokens outside the vocabulary.
    pub fn prefetch(&mut self, model: &Model, inputs: &[i32], targets: &[i32]) -> Result<()> {
        if self.ready {
            return Err(Error::Layout(
                "prefetch twice without a load: the staging buffer holds a batch",
            ));
        }
        if model.batch_words() != self.words {
            return Err(Error::Layout(
                "a model of another batch size than the loader's",
            ));
        }
        // The previous upload finished long ago in a running loop (the last step waited for
        // it); this only takes the host buffer back.
        let mut host = match (self.inflight.take(), self.host.take()) {
            (Some(p), _) => p.wait().map_err(xfer)?,
            (None, Some(h)) => h,
            (None, None) => {
                return Err(Error::Layout(
                    "the loader lost its host buffer to a failed upload",
                ))
            }
        };
        if let Err(e) = model.pack_batch(inputs, targets, &mut host) {
            self.host = Some(host);
            return Err(e);
        }
        // The copy out of the staging buffer (queued on the model's stream by the last
        // `load`) must be done before the upload overwrites it.
        if let Err(e) = self.copy.wait_event(&self.consumed) {
            self.host = Some(host);
            return Err(e.into());
        }
        self.inflight = Some(copy_to_device_async(host, &self.staging, &self.copy).map_err(xfer)?);
        self.uploaded.record(&self.copy)?;
        self.ready = true;
        Ok(())
    }

    /// Makes the model's stream wait for the prefetched batch and copies it into the model's
    /// batch buffer, in the model's stream order (after the step queued before it, which
    /// reads that buffer). Refused when nothing was prefetched.
    pub fn load(&mut self, model: &Model) -> Result<()> {
        if !self.ready {
            return Err(Error::Layout("load without a prefetched batch"));
        }
        if model.batch_words() != self.words {
            return Err(Error::Layout(
                "a model of another batch size than the loader's",
            ));
        }
        let s = model.stream();
        s.wait_event(&self.uploaded)?;
        model
            .batch_buffer()
            .copy_from_device_async(self.staging.as_ptr(), s)?;
        self.consumed.record(s)?;
        self.ready = false;
        Ok(())
    }
}

fn xfer(e: cudars_xfer::Error) -> Error {
    Error::Xfer(Box::new(e))
}
