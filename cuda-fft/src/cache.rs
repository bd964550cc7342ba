//! The plan cache: plans kept per device and [`Geometry`], least recently used dropped past a
//! bound (CuPy's `cupy.fft.config.get_plan_cache()`, 16 plans per device by default). The
//! one-call transforms ([`c2c`](crate::c2c), [`r2c`](crate::r2c), [`c2r`](crate::c2r),
//! [`exec`](crate::exec)) plan through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cudars_core::Device;

use crate::error::Result;
use crate::layout::{Geometry, Precision, Transform};
use crate::plan::Plan;

/// A cached plan, shared: lock it to run it.
pub type SharedPlan = Arc<Mutex<Plan>>;

struct Entry {
    plan: SharedPlan,
    used: u64,
}

/// A cache key: packed geometries by value (no allocation on a hit), others whole.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Packed {
        device: usize,
        transform: Transform,
        precision: Precision,
        shape: [usize; 3],
        rank: usize,
        batch: usize,
    },
    Advanced(usize, Geometry),
}

impl Key {
    fn device(&self) -> usize {
        match self {
            Key::Packed { device, .. } | Key::Advanced(device, _) => *device,
        }
    }

    fn packed(
        device: usize,
        transform: Transform,
        precision: Precision,
        shape: &[usize],
        batch: usize,
    ) -> Option<Key> {
        if shape.is_empty() || shape.len() > 3 {
            return None;
        }
        let mut s = [0; 3];
        s[..shape.len()].copy_from_slice(shape);
        Some(Key::Packed {
            device,
            transform,
            precision,
            shape: s,
            rank: shape.len(),
            batch,
        })
    }

    fn of(device: usize, g: &Geometry) -> Key {
        if !g.advanced {
            if let Some(k) = Key::packed(device, g.transform, g.precision, &g.shape, g.batch) {
                return k;
            }
        }
        Key::Advanced(device, g.clone())
    }
}

#[derive(Default)]
struct Cache {
    max: Option<usize>,
    entries: HashMap<Key, Entry>,
    clock: u64,
    hits: u64,
    misses: u64,
}

/// Plans per device kept when no size was set.
pub const DEFAULT_SIZE: usize = 16;

fn cache() -> &'static Mutex<Cache> {
    static CACHE: std::sync::OnceLock<Mutex<Cache>> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Cache::default()))
}

/// The plan for `geometry` on `device`: the cached one, or a new one (cached, dropping the
/// least recently used plan of the device past the bound). A plan being dropped from the
/// cache lives on while someone holds it.
pub fn plan(device: &Device, geometry: &Geometry) -> Result<SharedPlan> {
    let key = Key::of(device.ordinal(), geometry);
    lookup(device, key, || Ok(geometry.clone()))
}

/// [`plan`] for a packed geometry, without building one on a hit.
pub(crate) fn packed(
    device: &Device,
    transform: Transform,
    precision: Precision,
    shape: &[usize],
    batch: usize,
) -> Result<SharedPlan> {
    let geometry = || Geometry::packed(transform, precision, shape, batch);
    match Key::packed(device.ordinal(), transform, precision, shape, batch) {
        Some(key) => lookup(device, key, geometry),
        // (a shape of no or too many dimensions: refused by Geometry::packed)
        None => plan(device, &geometry()?),
    }
}

/// A thread's last hit: its key, the plan (weakly: a plan dropped from the cache is not
/// kept), and the cache's generation then.
type Memo = Option<(Key, std::sync::Weak<Mutex<Plan>>, u64)>;

thread_local! {
    static LAST: std::cell::RefCell<Memo> = const { std::cell::RefCell::new(None) };
    /// Set while a one-call transform looks up its plan for a stream being captured: a miss
    /// is then refused, not planned (planning allocates, which would end the capture).
    static NO_PLANNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `get` (a lookup) with planning refused on a miss when `stream` is being captured.
pub(crate) fn for_stream<R>(
    stream: &cudars_core::Stream,
    get: impl FnOnce() -> Result<R>,
) -> Result<R> {
    if crate::plan::capture_of(stream)?.is_none() {
        return get();
    }
    NO_PLANNING.with(|f| f.set(true));
    let r = get();
    NO_PLANNING.with(|f| f.set(false));
    r
}

/// Bumped by every change to the cache, so a thread's memo of its last hit is used only
/// while the cache still holds that plan.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Hits served by a thread's memo.
static MEMO_HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn changed() {
    GENERATION.fetch_add(1, std::sync::atomic::Ordering::Release);
}

fn lookup(
    device: &Device,
    key: Key,
    geometry: impl FnOnce() -> Result<Geometry>,
) -> Result<SharedPlan> {
    // The same plan as this thread's last call, with nothing evicted or cleared since: no
    // global lock (the LRU order is refreshed on the next full lookup).
    let generation = GENERATION.load(std::sync::atomic::Ordering::Acquire);
    let memo = LAST.with(|l| {
        l.borrow().as_ref().and_then(|(k, w, g)| {
            (*g == generation && *k == key)
                .then(|| w.upgrade())
                .flatten()
        })
    });
    if let Some(p) = memo {
        MEMO_HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(p);
    }
    let found = lookup_locked(device, key.clone(), geometry)?;
    LAST.with(|l| *l.borrow_mut() = Some((key, Arc::downgrade(&found), generation)));
    Ok(found)
}

fn lookup_locked(
    device: &Device,
    key: Key,
    geometry: impl FnOnce() -> Result<Geometry>,
) -> Result<SharedPlan> {
    {
        let mut c = cache().lock().unwrap_or_else(PoisonError::into_inner);
        c.clock += 1;
        let now = c.clock;
        if let Some(e) = c.entries.get_mut(&key) {
            e.used = now;
            let p = Arc::clone(&e.plan);
            c.hits += 1;
            return Ok(p);
        }
    }
    if NO_PLANNING.with(std::cell::Cell::get) {
        return Err(crate::Error::Unsupported {
            what: "FFT planning",
            why: "the stream is being captured: cuFFT allocates while it plans, which would \
                  end the capture; run the transform once before capturing (the cache keeps \
                  its plan) or capture a Plan made beforehand"
                .into(),
        });
    }
    // Planned outside the lock (it takes milliseconds); a racing thread may plan it too,
    // and the later insert wins.
    let plan = Arc::new(Mutex::new(Plan::new(device, geometry()?)?));
    let evicted;
    {
        let mut c = cache().lock().unwrap_or_else(PoisonError::into_inner);
        c.misses += 1;
        c.clock += 1;
        let now = c.clock;
        let max = c.max.unwrap_or(DEFAULT_SIZE);
        c.entries.insert(
            key,
            Entry {
                plan: Arc::clone(&plan),
                used: now,
            },
        );
        evicted = evict(&mut c, device.ordinal(), max);
        changed();
    }
    drop(evicted); // plans dropped outside the lock
    Ok(plan)
}

fn evict(c: &mut Cache, device: usize, max: usize) -> Vec<SharedPlan> {
    let mut out = Vec::new();
    loop {
        let mine: Vec<_> = c
            .entries
            .iter()
            .filter(|(k, _)| k.device() == device)
            .map(|(k, e)| (e.used, k.clone()))
            .collect();
        if mine.len() <= max {
            return out;
        }
        let Some((_, oldest)) = mine.into_iter().min_by_key(|(used, _)| *used) else {
            return out;
        };
        if let Some(e) = c.entries.remove(&oldest) {
            out.push(e.plan);
        }
    }
}

/// Sets the plans kept per device (0 keeps none); drops the surplus now.
pub fn set_size(max: usize) {
    let mut dropped = Vec::new();
    {
        let mut c = cache().lock().unwrap_or_else(PoisonError::into_inner);
        c.max = Some(max);
        let devices: Vec<usize> = c.entries.keys().map(Key::device).collect();
        for d in devices {
            dropped.extend(evict(&mut c, d, max));
        }
        changed();
    }
    drop(dropped);
}

/// The plans kept per device.
pub fn size() -> usize {
    cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .max
        .unwrap_or(DEFAULT_SIZE)
}

/// Plans cached now, over every device.
pub fn len() -> usize {
    cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entries
        .len()
}

/// `(hits, misses)` since the process started.
pub fn stats() -> (u64, u64) {
    let c = cache().lock().unwrap_or_else(PoisonError::into_inner);
    (
        c.hits + MEMO_HITS.load(std::sync::atomic::Ordering::Relaxed),
        c.misses,
    )
}

/// Drops every cached plan (those held elsewhere live on until released).
pub fn clear() {
    let all: Vec<Entry> = {
        let mut c = cache().lock().unwrap_or_else(PoisonError::into_inner);
        changed();
        c.entries.drain().map(|(_, e)| e).collect()
    };
    drop(all);
}
