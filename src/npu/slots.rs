//! The slots of a stream ring ([`super::stream::StreamRing`]) as the weights filled into them
//! see them: a slot's buffer, and the ring's free list and wait that a streamed weight
//! (`mm::WeightInner`) hands its slot back to when it is dropped. Below both the ring and the
//! weights it fills.

use std::sync::{Condvar, Mutex};

use super::kif::{Bo, DomainId};

/// One slot: its buffer (None until first filled) and the domain its IOVA was reserved in.
pub(crate) struct Slot {
    pub bo: Option<(Bo, DomainId)>,
}

/// What a ring shares with the weights filled into its slots: the free slots and the wait for
/// one, the bytes of the slots' buffers, and whether the ring is gone.
pub(crate) struct RingInner {
    pub free: Mutex<Vec<Slot>>,
    pub ready: Condvar,
    /// Bytes of the slots' buffers now.
    pub bytes: Mutex<u64>,
    /// The ring was dropped: slots that come back are freed.
    pub closed: std::sync::atomic::AtomicBool,
}

impl RingInner {
    /// A slot comes back (a fill failed, or its weight was dropped). Returns it when the ring is
    /// gone, for the caller to free.
    pub(crate) fn give_back(&self, slot: Slot) -> Option<Slot> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Some(slot);
        }
        free.push(slot);
        self.ready.notify_one();
        None
    }
}
