//! Which MUL_MATs read an activation another MUL_MAT quantized, read from the graph itself.
//!
//! Weights of one K that share a rotation (Q/K/V, gate/up) turn one activation into the same
//! int8 terms: the second MUL_MAT reading it may reuse the first's terms. Whether it does is a
//! fact of the graph, not of a release's node order or a weight's name: the same activation
//! tensor, and no node between the two that writes its memory. [`links`] reads that from a list
//! of [`Step`]s — the backend's pre-pass makes them from the live graph, `ork-route` from a
//! synthetic layer — and says for each MUL_MAT what the graph proves. What it does not prove
//! (a reader in another graph call, an activation the call ends with) is left to the
//! activation's hash (`backend::npu_mm`).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// One graph node as the rule needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A node that does no work (a view, a reshape): it writes nothing.
    View,
    /// A node that computes: `writes`, the tensor owning the memory it writes (itself, or the
    /// tensor it is a view of); `act`, for a MUL_MAT, its activation tensor and the tensor owning
    /// that one's memory.
    Work { writes: usize, act: Option<Act> },
}

/// A MUL_MAT's activation: the tensor (`src[1]`) and the tensor owning its memory (itself, or the
/// tensor it is a view of).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Act {
    pub tensor: usize,
    pub base: usize,
}

/// What the graph proves of one MUL_MAT's activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    /// The MUL_MAT before it reads the same activation and no node between them writes its
    /// memory: the int8 terms that one made are this one's, if it ran them.
    pub held: bool,
    /// Whether a later MUL_MAT reads the activation again.
    pub read_again: Again,
}

/// Whether a later MUL_MAT reads an activation again, as far as the graph shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Again {
    /// A later MUL_MAT of the graph reads it, nothing writing it between.
    Yes,
    /// A node of the graph writes its memory before any MUL_MAT reads it again.
    No,
    /// The graph ends first: a later graph call may read it.
    #[default]
    Unknown,
}

/// What a weight's MUL_MATs in graph walks showed of the activations it reads, for where the graph
/// does not tell ([`Again::Unknown`]: the graph call ends first): whether the next NPU MUL_MAT
/// after one of its runs reused that run's int8 terms (only the next one can: the thread holds
/// one activation's terms). Until a run says otherwise a weight's activation may be read again;
/// once a run was not followed by a reuse, it is taken not to be, except every
/// [`Seen::PROBE_EVERY`]th run (a graph of another shape, a weight routed elsewhere at another M,
/// may have shown it wrong), until a reuse shows otherwise. Where it is wrong, a key is missed (a
/// reuse lost), never a value.
#[derive(Debug, Default)]
pub struct Seen(AtomicU32);

/// [`Seen`]'s states: not seen yet, read again, and from `ONCE` up "not read again" with the runs
/// left before the next probe.
const UNSEEN: u32 = 0;
const AGAIN: u32 = 1;
const ONCE: u32 = 2;

impl Seen {
    /// Runs between two probes of a weight whose activation was not read again.
    pub const PROBE_EVERY: u32 = 64;

    /// Whether this run of the weight takes the key of its activation: it may be read again by
    /// the next MUL_MAT (not seen yet, seen read again, or a probe).
    pub fn may_be_read_again(&self) -> bool {
        match self.0.load(Relaxed) {
            UNSEEN | AGAIN => true,
            ONCE => {
                self.0.store(UNSEEN, Relaxed);
                true
            }
            _ => {
                self.0.fetch_sub(1, Relaxed);
                false
            }
        }
    }

    /// The next MUL_MAT reused the terms of this weight's run.
    pub fn read_again(&self) {
        self.0.store(AGAIN, Relaxed);
    }

    /// The next MUL_MAT did not reuse them.
    pub fn read_once(&self) {
        let _ = self.0.compare_exchange(UNSEEN, ONCE + Self::PROBE_EVERY, Relaxed, Relaxed);
    }
}

/// The [`Link`] of every step (the default for a step that is not a MUL_MAT). Linear in the
/// steps: one pass forward (the MUL_MAT before) and one backward
/// (the nearest later reader of each activation tensor and writer of each tensor's memory).
pub fn links(steps: &[Step]) -> Vec<Link> {
    let mut out = vec![Link::default(); steps.len()];
    let writes = |s: &Step, a: &Act| matches!(s, Step::Work { writes, .. } if *writes == a.base || *writes == a.tensor);
    let mut before: Option<(usize, Act)> = None;
    for (i, s) in steps.iter().enumerate() {
        let Step::Work { act: Some(a), .. } = s else { continue };
        if let Some((j, held)) = before {
            out[i].held = held.tensor == a.tensor && !steps[j + 1..i].iter().any(|s| writes(s, a));
        }
        before = Some((i, *a));
    }
    // Backward: for each MUL_MAT, whether a later MUL_MAT reads its tensor before a later node
    // writes its memory (the tensor or its base); neither: the graph ends first.
    let (mut read_at, mut written_at) = (std::collections::HashMap::new(), std::collections::HashMap::new());
    for (i, s) in steps.iter().enumerate().rev() {
        let Step::Work { writes, act } = s else { continue };
        if let Some(a) = act {
            let read = read_at.get(&a.tensor).copied();
            let written = [a.base, a.tensor].iter().filter_map(|t| written_at.get(t).copied()).min();
            out[i].read_again = match (read, written) {
                (Some(r), w) if w.is_none_or(|w| r <= w) => Again::Yes,
                (_, Some(_)) => Again::No,
                _ => Again::Unknown,
            };
            read_at.insert(a.tensor, i);
        }
        written_at.insert(*writes, i);
    }
    out
}

/// Where a MUL_MAT stands among the MUL_MATs that read its activation, as the cost model and
/// the backend's cut see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// It reads the activation the MUL_MAT before it quantized and reuses its int8 terms.
    pub held: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: Act = Act { tensor: 0x10, base: 0x10 };

    fn mm(out: usize, act: Act) -> Step {
        Step::Work { writes: out, act: Some(act) }
    }

    fn op(writes: usize) -> Step {
        Step::Work { writes, act: None }
    }

    #[test]
    fn the_rule_follows_the_graph_not_an_order() {
        // Q, its norm and RoPE (writing Q's output, not X), then K before V: both after Q hold its
        // terms; the norm between Q and K writes another tensor.
        let g = [mm(0x100, X), op(0x100), Step::View, op(0x100), mm(0x200, X), mm(0x300, X)];
        let l = links(&g);
        assert_eq!(l[0], Link { held: false, read_again: Again::Yes });
        assert_eq!(l[4], Link { held: true, read_again: Again::Yes });
        assert_eq!(l[5], Link { held: true, read_again: Again::Unknown });
        assert_eq!(l[1], Link::default(), "not a MUL_MAT");
        // A node between that writes X (in place, through a view of it): nothing held, and the
        // first MUL_MAT's activation is not read again.
        let v = Act { tensor: 0x11, base: 0x10 };
        let g = [mm(0x100, v), op(0x10), mm(0x200, v)];
        let l = links(&g);
        assert_eq!((l[0].read_again, l[2].held), (Again::No, false));
        // Writing the view itself counts too.
        assert!(!links(&[mm(0x100, v), op(0x11), mm(0x200, v)])[2].held);
        // Another activation's MUL_MAT between: its terms, not X's, are the held ones.
        let y = Act { tensor: 0x20, base: 0x20 };
        let l = links(&[mm(0x100, X), mm(0x200, y), mm(0x300, X)]);
        assert_eq!((l[1].held, l[2].held, l[0].read_again), (false, false, Again::Yes));
        // Another tensor viewing the same memory is not the same activation.
        assert!(!links(&[mm(0x100, X), mm(0x200, Act { tensor: 0x12, base: 0x10 })])[1].held);
    }

    #[test]
    fn a_weight_learns_whether_its_activation_is_read_again() {
        let s = Seen::default();
        assert!(s.may_be_read_again(), "until a run says otherwise");
        s.read_once();
        let runs: Vec<bool> = (0..=Seen::PROBE_EVERY).map(|_| s.may_be_read_again()).collect();
        let probes: Vec<usize> = (0..runs.len()).filter(|&i| runs[i]).collect();
        assert_eq!(probes, [Seen::PROBE_EVERY as usize], "a probe after PROBE_EVERY runs without a key");
        s.read_once();
        assert!(!s.may_be_read_again(), "the probe was not reused either");
        let s = Seen::default();
        s.read_again();
        s.read_once();
        assert!(s.may_be_read_again(), "read again stays");
    }
}
