//! A filter bitset kept on the device between searches.
//!
//! A bitset filter is a search parameter, so every search could upload its
//! words again. Searches in a row mostly pass the same bits (the query
//! batches of one search, a service's standing filter), so an index keeps
//! the last device copy with the host words it came from and uploads only
//! when the words differ: a compare of n / 8 bytes on the host instead of a
//! copy over the bus and a stream synchronisation.

use std::sync::{Arc, Mutex};

use crate::gpu::{GpuBuffer, GpuError, MemoryPool, Transfer};

use super::{Bitset, Filter};

/// A device copy and the host words it was uploaded from.
struct Kept {
    words: Vec<u32>,
    buf: Arc<GpuBuffer<u32>>,
}

/// The last bitset uploaded, if any.
#[derive(Default)]
pub(crate) struct ResidentBits {
    kept: Mutex<Option<Kept>>,
}

impl ResidentBits {
    /// The device copy of `b`: the kept one when the words are the same,
    /// else a fresh upload, kept instead. A search still using the previous
    /// copy holds its own `Arc`, and every use is ordered on the searcher's
    /// one stream.
    pub(crate) fn of(
        &self,
        t: &Transfer,
        pool: &MemoryPool,
        b: &Bitset,
    ) -> Result<Arc<GpuBuffer<u32>>, GpuError> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = kept.as_ref().filter(|k| k.words == b.words) {
            return Ok(k.buf.clone());
        }
        let buf = Arc::new(t.upload_new(pool, &b.words)?);
        *kept = Some(Kept {
            words: b.words.clone(),
            buf: buf.clone(),
        });
        Ok(buf)
    }

    /// [`of`](Self::of) the filter's bitset; `None` without one.
    pub(crate) fn of_filter(
        &self,
        t: &Transfer,
        pool: &MemoryPool,
        filter: &Filter,
    ) -> Result<Option<Arc<GpuBuffer<u32>>>, GpuError> {
        match filter {
            Filter::Bitset(b) => self.of(t, pool, b).map(Some),
            Filter::None => Ok(None),
        }
    }
}
