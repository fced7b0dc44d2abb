//! Inference weights kept between calls in the form `linear`'s products read: an `f32`
//! weight packed into the micro-kernel's panels, and a transposed or strided weight as a
//! contiguous copy. At batch 1 a model streams every weight once per forward; packing or
//! copying it at each call costs more than the product (a transposed weight ran 3× slower
//! than the same weight contiguous), while ONNX Runtime packs constant weights once.
//!
//! # Why a stale form is never served
//! An entry is keyed by the address of the weight's shared buffer (the `Arc` a
//! [`FlexTensor`] holds), its dtype and its layout, and keeps a [`Weak`] to that buffer.
//! While the `Weak` exists the allocation is not freed, so its address is not reused by
//! another buffer; and Flex writes into a buffer only through `Arc::get_mut` (refused while
//! a `Weak` exists) or `Arc::make_mut` (which then moves the values to a new allocation, at
//! a new address). A changed weight (an optimizer step, `load_record`) is therefore always a
//! different key, and an entry whose buffer is gone is dropped at the next miss.
//!
//! The cache holds at most [`CAPACITY`] bytes of prepared forms; past it a weight is prepared
//! for the call alone, as before. A training step's weights are new buffers at every step,
//! so they are prepared once a step and dropped the step after: a copy of each weight per
//! step, where the step's products have 8 to 64 rows or its weights are transposed (with
//! more rows `sgemm` packs at every call anyway). Only weights that stay, an inference
//! model's, are reused.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use burn::backend::flex::FlexTensor;
use burn::tensor::{Bytes, DType};

/// The most bytes of prepared weights kept at once (1 GiB: a 250 M-parameter model's `f32`
/// weights), so that a process serving several models does not double its memory unbounded.
pub(super) const CAPACITY: usize = 1 << 30;

/// A prepared form's size, counted against [`CAPACITY`].
pub(super) trait Footprint: Any + Send + Sync {
    /// The bytes it holds.
    fn bytes(&self) -> usize;
}

impl Footprint for burn_cpu_kernels::sgemm::PackedRhs {
    fn bytes(&self) -> usize {
        burn_cpu_kernels::sgemm::PackedRhs::bytes(self)
    }
}

impl Footprint for FlexTensor {
    fn bytes(&self) -> usize {
        FlexTensor::bytes(self).len()
    }
}

/// What an entry holds for its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Form {
    /// `sgemm::PackedRhs` of an `f32` weight.
    PackedF32,
    /// The weight's values row-major, for a weight whose rows are not contiguous.
    Contiguous,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    buffer: usize,
    dtype: DType,
    form: Form,
    offset: usize,
    shape: Vec<usize>,
    strides: Vec<isize>,
}

struct Entry {
    buffer: Weak<Bytes>,
    value: Arc<dyn Any + Send + Sync>,
    bytes: usize,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, Entry>,
    bytes: usize,
}

impl Cache {
    /// Drops the entries whose buffer no tensor holds any more.
    fn purge(&mut self) {
        let mut freed = 0;
        self.entries.retain(|_, entry| {
            let alive = entry.buffer.strong_count() > 0;
            if !alive {
                freed += entry.bytes;
            }
            alive
        });
        self.bytes -= freed;
    }
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(Mutex::default);

/// `weight`'s prepared `form`: the kept one, or `make()`'s, kept if it fits. `make` runs
/// outside the lock; two threads missing at once both prepare, and one keeps it.
pub(super) fn prepared<V: Footprint>(
    weight: &FlexTensor,
    form: Form,
    make: impl FnOnce() -> V,
) -> Arc<V> {
    let buffer = weight.data_arc();
    let layout = weight.layout();
    let key = Key {
        buffer: Arc::as_ptr(&buffer) as usize,
        dtype: weight.dtype(),
        form,
        offset: layout.start_offset(),
        shape: layout.shape().to_vec(),
        strides: layout.strides().to_vec(),
    };
    {
        let mut cache = lock();
        if let Some(entry) = cache.entries.get(&key)
            && let Ok(value) = entry.value.clone().downcast::<V>()
        {
            return value;
        }
        cache.purge();
    }
    let value = Arc::new(make());
    let bytes = value.bytes();
    let mut cache = lock();
    if cache.bytes + bytes <= CAPACITY {
        let entry = Entry {
            buffer: Arc::downgrade(&buffer),
            value: value.clone(),
            bytes,
        };
        if let Some(old) = cache.entries.insert(key, entry) {
            cache.bytes -= old.bytes;
        }
        cache.bytes += bytes;
    }
    value
}

/// The cache, whatever a panicking holder left (every entry is whole when inserted).
fn lock() -> MutexGuard<'static, Cache> {
    CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flex_view;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A form that claims a size, for the capacity.
    struct Claimed(usize);

    impl Footprint for Claimed {
        fn bytes(&self) -> usize {
            self.0
        }
    }

    fn weight(seed: f32) -> FlexTensor {
        flex_view::tensor((0..12).map(|i| i as f32 + seed).collect::<Vec<_>>(), [3, 4])
    }

    fn address(tensor: &FlexTensor) -> usize {
        Arc::as_ptr(&tensor.data_arc()) as usize
    }

    fn kept(buffer: usize) -> bool {
        let mut cache = lock();
        cache.purge();
        cache.entries.keys().any(|key| key.buffer == buffer)
    }

    /// A form is made once per buffer and layout, made again once the buffer is written
    /// (Flex's copy-on-write moves it), and dropped with its buffer.
    #[test]
    fn a_kept_form_is_reused_until_its_buffer_changes() {
        let made = AtomicUsize::new(0);
        let make = |t: &FlexTensor| {
            prepared(t, Form::Contiguous, || {
                made.fetch_add(1, Ordering::SeqCst);
                // A copy: a form holding the weight's own buffer would keep it alive.
                let values = flex_view::values::<f32>(t).unwrap().to_vec();
                flex_view::tensor(values, t.layout().shape().clone())
            })
        };
        let w = weight(0.0);
        let first = make(&w);
        let again = make(&w.clone());
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(made.load(Ordering::SeqCst), 1);
        // The transposed view is another layout of the same buffer: another form.
        let t = w.clone().with_layout(w.layout().transpose(0, 1));
        let _ = prepared(&t, Form::Contiguous, || Claimed(48));
        // No writing in place while a form is kept: `try_storage_mut` refuses, and
        // `storage_mut` (copy-on-write) moves the values to a new buffer.
        let mut w = w;
        drop(t);
        assert!(w.try_storage_mut::<f32>().is_none());
        let before = address(&w);
        w.storage_mut::<f32>()[0] = 100.0;
        assert_ne!(address(&w), before);
        let changed = make(&w);
        assert_eq!(made.load(Ordering::SeqCst), 2);
        let first_value = |t: &FlexTensor| flex_view::values::<f32>(t).unwrap()[0];
        assert_eq!((first_value(&first), first_value(&changed)), (0.0, 100.0));
        // The old buffer is gone (only the kept `Weak` held it): its forms are dropped.
        assert!(!kept(before));
        let now = address(&w);
        assert!(kept(now));
        drop(w);
        assert!(!kept(now));
    }

    /// A form larger than what is left of the capacity is made for the call and not kept.
    #[test]
    fn forms_past_the_capacity_are_not_kept() {
        let w = weight(1.0);
        let made = AtomicUsize::new(0);
        for _ in 0..2 {
            let _ = prepared(&w, Form::PackedF32, || {
                made.fetch_add(1, Ordering::SeqCst);
                Claimed(CAPACITY + 1)
            });
        }
        assert_eq!(made.load(Ordering::SeqCst), 2);
        assert!(!kept(address(&w)));
    }
}
