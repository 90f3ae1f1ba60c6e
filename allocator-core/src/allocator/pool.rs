//! Best-fit pools of free blocks (PyTorch's `BlockPool`).
//!
//! PyTorch keeps one set ordered by `(stream, size, address)` and takes the lower
//! bound of `(stream, size, 0)`: the smallest block of at least the request on
//! the stream, the lowest address among equal sizes. Here each stream has a
//! segregated-fit index (TLSF's two-level layout) that returns exactly that
//! block without a tree:
//!
//! ```text
//!   size ──▶ bin (monotonic: a larger size never maps to a lower bin)
//!            sizes < 32·512 B: one bin per 512 B step; above: 32 bins per power of two
//!   bins[b]: min   the bin's smallest entry, inline in the header (size 0: empty)
//!            rest  Vec<Entry> of the others sorted by (size, address), DESCENDING
//!                  (most bins hold 0–3 entries; a bin of one has no buffer)
//!   groups:  u64, bit g set ⇔ some bin of group g (32 bins) is non-empty
//!   nonempty[g]: u32, bit i set ⇔ bins[32·g + i] is non-empty
//! ```
//!
//! A bin reads as one descending sequence, `rest` then `min` (logical index
//! `rest.len()` is `min`). Best fit for `size`: `bins[bin(size)].min` when it is
//! at least `size` (the usual case: no search and no load of the entry
//! buffer); else a binary search in that bin's `rest` for the last entry of at
//! least `size`; if there is none, the `min` of the next non-empty bin (two
//! `trailing_zeros`). Every entry of a higher bin is larger than every entry of
//! a lower one, so this is the global minimum of `(size, address)` over the
//! blocks of at least `size` — PyTorch's choice. Taking `min` refills it with a
//! `pop` of `rest` (its smallest), never a shift. Other inserts and removes are
//! a binary search and a `Vec` shift; bins keep their capacity, so the steady
//! state allocates nothing, and a bin that never holds two blocks at once
//! never allocates at all. `unmapped` holds the unmapped blocks of expandable
//! segments in address order (cold paths only).

use super::block::BlockId;
use crate::device::{DevicePtr, StreamId};
use std::collections::BTreeMap;

/// Key of the address-ordered set.
pub(crate) type AddrKey = (StreamId, DevicePtr);

/// log2 of the bins per power of two (and of the linear bins' count).
const SL_BITS: u32 = 5;
/// Bins per power of two.
const SL_COUNT: usize = 1 << SL_BITS;
/// Sizes are indexed in 512-byte units (every block size is a multiple of 512).
const UNIT_SHIFT: u32 = 9;
/// Largest unit count's log2 + 1: sizes are < 1 EiB = 2^60 bytes, so units < 2^51.
/// Larger sizes (only as search keys) clamp to the last bin.
const FL_MAX: u32 = 51;
/// Number of bins: the linear bins, then `SL_COUNT` per power of two from
/// `2^SL_BITS` units up to `2^FL_MAX`.
const BIN_COUNT: usize = SL_COUNT * (FL_MAX - SL_BITS + 1) as usize;
/// Groups of `SL_COUNT` bins, one bit each in `groups` (must fit a `u64`).
const GROUP_COUNT: usize = BIN_COUNT / SL_COUNT;
const _: () = assert!(GROUP_COUNT <= 64);

/// The bin of `size`: monotonic non-decreasing in `size`.
///
/// Without branches: with `fl = max(log2(units), SL_BITS)` and
/// `shift = fl - SL_BITS`, `units >> shift` is the unit count itself below
/// `SL_COUNT` units (the linear bins, `shift` = 0) and `SL_COUNT + sl` above,
/// where `sl` is the second-level index; so `(shift << SL_BITS) + (units >>
/// shift)` is `units` for the linear bins and `(fl − SL_BITS + 1)·SL_COUNT + sl`
/// above them. Sizes of `2^FL_MAX` units and more clamp to the last bin.
#[inline]
pub(crate) const fn bin_of(size: usize) -> usize {
    let units = (size >> UNIT_SHIFT) as u64;
    // `| 1`: log2 of 0 units reads as 0 (then `fl` = SL_BITS, bin 0).
    let log2 = 63 - (units | 1).leading_zeros();
    let fl = if log2 > SL_BITS { log2 } else { SL_BITS };
    let shift = fl - SL_BITS;
    let bin = ((shift as usize) << SL_BITS) + (units >> shift) as usize;
    if bin < BIN_COUNT {
        bin
    } else {
        BIN_COUNT - 1
    }
}

/// Where `(size, ptr)` is or would go in a bin sorted descending: the number
/// of entries with a larger key.
#[inline]
fn descending_position(bin: &[Entry], size: usize, ptr: DevicePtr) -> usize {
    let key = key_of(size, ptr);
    bin.partition_point(|x| x.key() > key)
}

/// Index of the entry keyed `(size, ptr)` in a descending bin, if there.
#[inline]
fn find_in(bin: &[Entry], size: usize, ptr: DevicePtr) -> Option<usize> {
    let i = descending_position(bin, size, ptr);
    bin.get(i)
        .is_some_and(|x| x.key() == key_of(size, ptr))
        .then_some(i)
}

/// The pool's order `(size, address)` as one integer: comparing two keys is
/// a two-word compare without branches, so the bin searches compile to
/// conditional moves.
#[inline(always)]
fn key_of(size: usize, ptr: DevicePtr) -> u128 {
    ((size as u128) << 64) | ptr as u128
}

/// Entries a bin's `rest` has room for when first used: a bin that holds two
/// blocks at once usually comes to hold a few, and starting at 8 rather than
/// `Vec`'s 4 saves their first reallocation (and its copy) on a fresh allocator.
const BIN_FIRST_CAPACITY: usize = 8;

/// Gives a bin's `rest` its first buffer.
#[cold]
fn first_use(rest: &mut Vec<Entry>) {
    rest.reserve_exact(BIN_FIRST_CAPACITY);
}

/// A free block as the pool stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub size: usize,
    pub ptr: DevicePtr,
    pub id: BlockId,
}

impl Entry {
    /// The `min` of an empty bin (no block has size 0).
    const NONE: Entry = Entry {
        size: 0,
        ptr: 0,
        id: BlockId::SENTINEL,
    };

    #[inline(always)]
    fn key(&self) -> u128 {
        key_of(self.size, self.ptr)
    }
}

/// One size bin: its smallest entry inline, the others in a descending `Vec`.
/// Read as one descending sequence, `rest[0..]` then `min`; positions
/// ([`Slot::at`]) are indices into that sequence, `rest.len()` being `min`.
/// Invariants: `min.size == 0` iff the bin is empty (and then `rest` is empty);
/// every entry of `rest` is larger than `min`.
#[derive(Debug, Clone)]
struct Bin {
    min: Entry,
    rest: Vec<Entry>,
}

impl Default for Bin {
    fn default() -> Bin {
        Bin {
            min: Entry::NONE,
            rest: Vec::new(),
        }
    }
}

impl Bin {
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.min.size == 0
    }

    /// Entries in the bin.
    #[inline(always)]
    fn len(&self) -> usize {
        self.rest.len() + usize::from(!self.is_empty())
    }

    /// The entry at position `at` (< `len()`) of the descending sequence.
    #[inline(always)]
    fn get(&self, at: usize) -> Entry {
        match self.rest.get(at) {
            Some(&e) => e,
            None => {
                debug_assert!(at == self.rest.len() && !self.is_empty());
                self.min
            }
        }
    }

    /// Sets the entry at position `at` (< `len()`).
    #[inline(always)]
    fn set(&mut self, at: usize, e: Entry) {
        match self.rest.get_mut(at) {
            Some(x) => *x = e,
            None => self.min = e,
        }
    }

    /// Position of the entry keyed `(size, ptr)`, if there (`size > 0`).
    #[inline]
    fn find(&self, size: usize, ptr: DevicePtr) -> Option<usize> {
        // An empty bin's `min` is keyed (0, 0): size 0 would find it and hand
        // out `BlockId::SENTINEL`, which is not an arena slot.
        debug_assert!(size > 0, "find of a zero-size entry");
        if self.min.key() == key_of(size, ptr) {
            return Some(self.rest.len());
        }
        find_in(&self.rest, size, ptr)
    }

    /// Removes the entry at position `at` (< `len()`); true when the bin is
    /// empty after.
    #[inline(always)]
    fn remove_at(&mut self, at: usize) -> bool {
        if at < self.rest.len() {
            self.rest.remove(at);
            false
        } else {
            self.min = self.rest.pop().unwrap_or(Entry::NONE);
            self.is_empty()
        }
    }

    /// The entries, largest first.
    fn descending(&self) -> impl Iterator<Item = Entry> + '_ {
        let min = (!self.is_empty()).then_some(self.min);
        self.rest.iter().copied().chain(min)
    }
}

/// The free blocks of one stream. Invariants: each `bins[b]` is a [`Bin`]
/// holding only sizes with `bin_of(size) == b`; bit `b % 32` of
/// `nonempty[b / 32]` is set iff `bins[b]` is non-empty; bit `g` of `groups` is
/// set iff `nonempty[g] != 0`. `bins` grows to the highest bin ever used (a
/// missing bin is empty), so a small pool's index stays a few KiB.
#[derive(Debug)]
struct StreamIndex {
    stream: StreamId,
    groups: u64,
    nonempty: [u32; GROUP_COUNT],
    bins: Vec<Bin>,
}

impl StreamIndex {
    fn new(stream: StreamId) -> Self {
        StreamIndex {
            stream,
            groups: 0,
            nonempty: [0; GROUP_COUNT],
            bins: Vec::new(),
        }
    }

    #[inline]
    fn mark(&mut self, bin: usize) {
        self.nonempty[bin / SL_COUNT] |= 1 << (bin % SL_COUNT);
        self.groups |= 1 << (bin / SL_COUNT);
    }

    #[inline]
    fn unmark(&mut self, bin: usize) {
        let g = bin / SL_COUNT;
        self.nonempty[g] &= !(1 << (bin % SL_COUNT));
        if self.nonempty[g] == 0 {
            self.groups &= !(1 << g);
        }
    }

    /// The first non-empty bin at or above `bin`.
    #[inline(always)]
    fn next_nonempty(&self, bin: usize) -> Option<usize> {
        if bin >= BIN_COUNT {
            return None;
        }
        let g = bin / SL_COUNT;
        let in_group = self.nonempty[g] & (u32::MAX << (bin % SL_COUNT));
        if in_group != 0 {
            return Some(g * SL_COUNT + in_group.trailing_zeros() as usize);
        }
        let above = self.groups & u64::MAX.checked_shl(g as u32 + 1).unwrap_or(0);
        if above == 0 {
            return None;
        }
        let g = above.trailing_zeros() as usize;
        Some(g * SL_COUNT + self.nonempty[g].trailing_zeros() as usize)
    }

    /// The smallest entry of at least `size` and its position `(bin, index)`.
    #[inline(always)]
    fn lower_bound(&self, size: usize) -> Option<(Entry, usize, usize)> {
        // Every entry has a size > 0, so 0 finds what 1 does (and an empty
        // bin's `min`, of size 0, never qualifies).
        let size = size.max(1);
        let b = bin_of(size);
        if let Some(bin) = self.bins.get(b) {
            // The usual hit: the bin's smallest entry, read from its header.
            if bin.min.size >= size {
                return Some((bin.min, b, bin.rest.len()));
            }
            // Descending: the entries of at least `size` are a prefix of `rest`.
            let i = bin.rest.partition_point(|e| e.size >= size);
            if i > 0 {
                return Some((bin.rest[i - 1], b, i - 1));
            }
        }
        let b = self.next_nonempty(b + 1)?;
        let bin = &self.bins[b];
        Some((bin.min, b, bin.rest.len()))
    }

    #[inline]
    fn insert(&mut self, e: Entry) -> bool {
        let b = bin_of(e.size);
        if b >= self.bins.len() {
            self.grow(b);
        }
        debug_assert!(e.size > 0, "a pool entry of size 0");
        let bin = &mut self.bins[b];
        if bin.is_empty() {
            bin.min = e;
            self.mark(b);
            return true;
        }
        let key = e.key();
        let min_key = bin.min.key();
        if key == min_key {
            return false;
        }
        if bin.rest.capacity() == 0 {
            first_use(&mut bin.rest);
        }
        if key < min_key {
            // A new smallest entry: the old one is the smallest of `rest`.
            bin.rest.push(bin.min);
            bin.min = e;
        } else if bin.rest.last().is_none_or(|l| key < l.key()) {
            // The smallest of `rest`: appended, no search and no shift.
            bin.rest.push(e);
        } else {
            let i = descending_position(&bin.rest, e.size, e.ptr);
            if bin.rest.get(i).is_some_and(|x| x.key() == key) {
                return false;
            }
            bin.rest.insert(i, e);
        }
        true
    }

    #[inline]
    fn remove(&mut self, size: usize, ptr: DevicePtr) -> Option<BlockId> {
        let b = bin_of(size);
        let bin = self.bins.get_mut(b)?;
        let at = bin.find(size, ptr)?;
        let id = bin.get(at).id;
        if bin.remove_at(at) {
            self.unmark(b);
        }
        Some(id)
    }

    /// Makes bins up to `bin` exist.
    #[cold]
    fn grow(&mut self, bin: usize) {
        self.bins.resize_with(bin + 1, Bin::default);
    }

    /// Every entry in `(size, address)` order, visiting only non-empty bins.
    fn iter(&self) -> AtLeast<'_> {
        match self.next_nonempty(0) {
            Some(bin) => AtLeast {
                index: Some(self),
                bin,
                at: self.bins[bin].len(),
            },
            None => AtLeast {
                index: None,
                bin: 0,
                at: 0,
            },
        }
    }
}

/// Where an entry lies: stream, bin and index in the bin.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    stream: u32,
    bin: u32,
    at: u32,
}

/// Entries of one stream from a position on, in `(size, address)` order
/// (bins upwards, each bin from its end down, as bins are descending).
pub(crate) struct AtLeast<'a> {
    index: Option<&'a StreamIndex>,
    bin: usize,
    /// Entries of `bins[bin]` still to visit: indices `at - 1` down to 0.
    at: usize,
}

impl Iterator for AtLeast<'_> {
    type Item = Entry;

    #[inline]
    fn next(&mut self) -> Option<Entry> {
        let index = self.index?;
        if self.at > 0 {
            self.at -= 1;
            return Some(index.bins[self.bin].get(self.at));
        }
        match index.next_nonempty(self.bin + 1) {
            Some(b) => {
                let bin = &index.bins[b];
                self.bin = b;
                self.at = bin.rest.len();
                Some(bin.min)
            }
            None => {
                self.index = None;
                None
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct BlockPool {
    /// Free mapped blocks per stream, streams in ascending order. A stream's
    /// index stays (possibly empty) once created, so its bins are reused.
    streams: Vec<StreamIndex>,
    /// Number of blocks over all streams.
    len: usize,
    /// Unmapped expandable blocks, address order.
    pub unmapped: BTreeMap<AddrKey, BlockId>,
    /// GC clock: advanced by lookups while garbage collection is enabled.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    pub(crate) fn new() -> Self {
        BlockPool {
            streams: Vec::new(),
            len: 0,
            unmapped: BTreeMap::new(),
            get_free_blocks_call_count: 0,
        }
    }

    #[inline]
    fn index(&self, stream: StreamId) -> Option<&StreamIndex> {
        self.streams.iter().find(|s| s.stream == stream)
    }

    #[inline]
    fn index_mut(&mut self, stream: StreamId) -> &mut StreamIndex {
        let i = match self.streams.iter().position(|s| s.stream == stream) {
            Some(i) => i,
            None => self.add_stream(stream),
        };
        &mut self.streams[i]
    }

    /// A pool that already holds the (empty) index of `stream` with its first
    /// `bins` bins made: a fresh allocator's first inserts on its default
    /// stream then neither create the index nor grow its bins (each growth
    /// copies the bins made so far).
    pub(crate) fn with_stream(stream: StreamId, bins: usize) -> Self {
        let mut index = StreamIndex::new(stream);
        index.bins.resize_with(bins.min(BIN_COUNT), Bin::default);
        BlockPool {
            streams: vec![index],
            ..BlockPool::new()
        }
    }

    #[cold]
    fn add_stream(&mut self, stream: StreamId) -> usize {
        let at = self.streams.partition_point(|s| s.stream < stream);
        self.streams.insert(at, StreamIndex::new(stream));
        at
    }

    /// Adds a free block.
    #[inline]
    pub(crate) fn insert(&mut self, stream: StreamId, size: usize, ptr: DevicePtr, id: BlockId) {
        if self.index_mut(stream).insert(Entry { size, ptr, id }) {
            self.len += 1;
        }
    }

    /// Removes a free block; returns its id if it was there.
    #[inline]
    pub(crate) fn remove(
        &mut self,
        stream: StreamId,
        size: usize,
        ptr: DevicePtr,
    ) -> Option<BlockId> {
        let i = self.streams.iter().position(|s| s.stream == stream)?;
        let removed = self.streams[i].remove(size, ptr);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// The id stored for `(stream, size, ptr)`, if any.
    #[cfg(any(test, feature = "invariant-checks"))]
    pub(crate) fn get(&self, stream: StreamId, size: usize, ptr: DevicePtr) -> Option<BlockId> {
        let bin = self.index(stream)?.bins.get(bin_of(size))?;
        bin.find(size, ptr).map(|i| bin.get(i).id)
    }

    /// Number of free blocks.
    #[cfg(any(test, feature = "invariant-checks"))]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every free block in `(stream, size, address)` order.
    pub(crate) fn ids(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.len);
        for s in &self.streams {
            out.extend(s.iter().map(|e| e.id));
        }
        out
    }

    /// The best fit for `size` on `stream` (the first of [`BlockPool::at_least`])
    /// and where it lies, for [`BlockPool::remove_slot`].
    #[inline(always)]
    pub(crate) fn best_fit(&self, stream: StreamId, size: usize) -> Option<(Entry, Slot)> {
        let s = self.streams.iter().position(|s| s.stream == stream)?;
        let (entry, bin, at) = self.streams[s].lower_bound(size)?;
        let slot = Slot {
            stream: s as u32,
            bin: bin as u32,
            at: at as u32,
        };
        Some((entry, slot))
    }

    /// Removes the entry at `slot`, from [`BlockPool::best_fit`] with no change
    /// to the pool since.
    #[inline(always)]
    pub(crate) fn remove_slot(&mut self, slot: Slot) {
        let index = &mut self.streams[slot.stream as usize];
        if index.bins[slot.bin as usize].remove_at(slot.at as usize) {
            index.unmark(slot.bin as usize);
        }
        self.len -= 1;
    }

    /// Where the entry of `(stream, size, ptr)` lies, if it is in the pool.
    #[inline]
    pub(crate) fn find(&self, stream: StreamId, size: usize, ptr: DevicePtr) -> Option<Slot> {
        let s = self.streams.iter().position(|s| s.stream == stream)?;
        let b = bin_of(size);
        let at = self.streams[s].bins.get(b)?.find(size, ptr)?;
        Some(Slot {
            stream: s as u32,
            bin: b as u32,
            at: at as u32,
        })
    }

    /// Gives the entry at `slot` (from [`BlockPool::best_fit`] or
    /// [`BlockPool::find`], no change to the pool since) the new key and id in
    /// place, when the key stays in the same bin and between its neighbours:
    /// the pool then holds exactly what removing the entry and inserting the
    /// new one would give. Returns false, changing nothing, otherwise.
    #[inline(always)]
    pub(crate) fn rekey(&mut self, slot: Slot, size: usize, ptr: DevicePtr, id: BlockId) -> bool {
        if bin_of(size) != slot.bin as usize {
            return false;
        }
        let bin = &mut self.streams[slot.stream as usize].bins[slot.bin as usize];
        let at = slot.at as usize;
        let key = key_of(size, ptr);
        // Neighbours in the descending sequence: the larger at `at - 1`, the
        // smaller at `at + 1` (none when `at` is `min`).
        if at > 0 && bin.get(at - 1).key() <= key {
            return false;
        }
        if at < bin.rest.len() && bin.get(at + 1).key() >= key {
            return false;
        }
        bin.set(at, Entry { size, ptr, id });
        true
    }

    /// Free blocks of `stream` with size ≥ `size`, best fit first.
    #[inline]
    pub(crate) fn at_least(&self, stream: StreamId, size: usize) -> AtLeast<'_> {
        let index = self.index(stream);
        match index.and_then(|s| s.lower_bound(size)) {
            Some((_, bin, at)) => AtLeast {
                index,
                bin,
                at: at + 1,
            },
            None => AtLeast {
                index: None,
                bin: 0,
                at: 0,
            },
        }
    }

    /// Free blocks of `stream` with size < `size`, largest first (cold: the
    /// release of cached oversize blocks before an out-of-memory error).
    pub(crate) fn below_descending(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = Entry> + '_ {
        let top = bin_of(size);
        self.index(stream).into_iter().flat_map(move |s| {
            s.bins[..s.bins.len().min(top + 1)]
                .iter()
                .rev()
                .flat_map(Bin::descending)
                .filter(move |e| e.size < size)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_order_within_a_stream_and_stream_order_overall() {
        let mut p = BlockPool::new();
        let s1 = StreamId(1);
        let s0 = StreamId(0);
        p.insert(s1, 4096, 0x3000, BlockId::test(1));
        p.insert(s1, 1024, 0x9000, BlockId::test(2));
        p.insert(s1, 4096, 0x1000, BlockId::test(3));
        p.insert(s0, 512, 0x5000, BlockId::test(4));
        assert_eq!(p.len(), 4);
        let fit: Vec<u32> = p.at_least(s1, 2000).map(|e| e.id.test_index()).collect();
        assert_eq!(fit, vec![3, 1], "equal sizes: lowest address first");
        let below: Vec<u32> = p
            .below_descending(s1, 4096)
            .map(|e| e.id.test_index())
            .collect();
        assert_eq!(below, vec![2]);
        assert_eq!(
            p.ids().iter().map(|b| b.test_index()).collect::<Vec<_>>(),
            vec![4, 2, 3, 1]
        );
        assert_eq!(p.remove(s1, 4096, 0x1000), Some(BlockId::test(3)));
        assert_eq!(p.remove(s1, 4096, 0x1000), None);
        assert_eq!(p.get(s1, 4096, 0x3000), Some(BlockId::test(1)));
        assert_eq!(p.at_least(StreamId(9), 0).count(), 0);
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn bins_are_monotonic_and_cover_every_size() {
        let mut last = 0;
        let mut size = 1usize;
        while size < (1usize << 62) {
            for s in [size - 1, size, size + 511, size + (size >> 3), size * 3 / 2] {
                assert!(bin_of(s) < BIN_COUNT, "bin_of({s}) out of range");
            }
            let b = bin_of(size);
            assert!(b >= last, "bin_of({size}) = {b} < {last}");
            last = b;
            size += (size >> 4).max(1);
        }
        assert_eq!(bin_of(usize::MAX), BIN_COUNT - 1);
        // The branch-free form against the two-level definition.
        let reference = |size: usize| {
            let units = (size >> UNIT_SHIFT) as u64;
            if units < SL_COUNT as u64 {
                return units as usize;
            }
            let fl = 63 - units.leading_zeros();
            if fl >= FL_MAX {
                return BIN_COUNT - 1;
            }
            let sl = (units >> (fl - SL_BITS)) as usize & (SL_COUNT - 1);
            (fl - SL_BITS + 1) as usize * SL_COUNT + sl
        };
        for shift in 0..usize::BITS {
            let p = 1usize << shift;
            for s in [p - 1, p, p + 1, p + 511, p + 512, p | (p >> 1), p | (p - 1)] {
                assert_eq!(bin_of(s), reference(s), "bin_of({s})");
            }
        }
        for s in (0..(64usize << 20)).step_by(512) {
            assert_eq!(bin_of(s), reference(s), "bin_of({s})");
        }
        // The linear bins: one per 512 B step.
        assert_eq!((bin_of(512), bin_of(1023), bin_of(1024)), (1, 1, 2));
    }

    /// The index against a `BTreeMap` over `(size, ptr)` (the previous
    /// implementation) on random inserts, removes and queries: every best fit,
    /// descending walk and full listing agree.
    #[test]
    fn index_matches_an_ordered_map() {
        let mut state = 0x1234_5678_u64;
        let mut rand = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let sizes = [512usize, 1024, 4096, 1 << 20, 2 << 20, 20 << 20, 1 << 40];
        let mut p = BlockPool::new();
        let mut model: BTreeMap<(u64, usize, DevicePtr), u32> = BTreeMap::new();
        for step in 0..20_000u32 {
            let stream = rand() % 3;
            let size = if rand() % 2 == 0 {
                sizes[(rand() % sizes.len() as u64) as usize]
            } else {
                ((rand() % (1 << 16)) as usize + 1) << (rand() % 20 + 9)
            };
            let ptr = (rand() % 64) << 20;
            match rand() % 3 {
                0 | 1 => {
                    let fresh = !model.contains_key(&(stream, size, ptr));
                    p.insert(StreamId(stream), size, ptr, BlockId::test(step));
                    if fresh {
                        model.insert((stream, size, ptr), step);
                    }
                }
                _ => {
                    let want = model.remove(&(stream, size, ptr)).map(BlockId::test);
                    if want.is_none() {
                        // Remove an existing block instead, found through the model.
                        if let Some((&k, _)) = model.range((stream, size, 0)..).next() {
                            let id = model.remove(&k).map(BlockId::test);
                            assert_eq!(p.remove(StreamId(k.0), k.1, k.2), id);
                        }
                        continue;
                    }
                    assert_eq!(p.remove(StreamId(stream), size, ptr), want);
                }
            }
            let q = (rand() % (64 << 20)) as usize;
            let got: Vec<u32> = p
                .at_least(StreamId(stream), q)
                .map(|e| e.id.test_index())
                .collect();
            let want: Vec<u32> = model
                .range((stream, q, 0)..(stream + 1, 0, 0))
                .map(|(_, &v)| v)
                .collect();
            assert_eq!(got, want, "step {step}: at_least({q})");
            let got: Vec<u32> = p
                .below_descending(StreamId(stream), q)
                .map(|e| e.id.test_index())
                .collect();
            let want: Vec<u32> = model
                .range((stream, 0, 0)..(stream, q, 0))
                .rev()
                .map(|(_, &v)| v)
                .collect();
            assert_eq!(got, want, "step {step}: below_descending({q})");
            assert_eq!(p.len(), model.len());
        }
        let ids: Vec<u32> = p.ids().iter().map(|b| b.test_index()).collect();
        assert_eq!(ids, model.values().copied().collect::<Vec<_>>());
    }

    /// `rekey` changes an entry in place only when that gives what removing it
    /// and inserting the new key would, and changes nothing otherwise.
    #[test]
    fn rekey_is_remove_and_insert() {
        let mut state = 0x2545_f491_u64;
        let mut rand = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let s = StreamId(0);
        let mut p = BlockPool::new();
        let mut model: BTreeMap<(usize, DevicePtr), u32> = BTreeMap::new();
        let mut rekeyed = 0;
        for step in 0..20_000u32 {
            let size = ((rand() % 64) as usize + 1) << (rand() % 4 * 3 + 9);
            let ptr = (rand() % 256) << 20;
            if model.len() < 40 && !model.contains_key(&(size, ptr)) {
                p.insert(s, size, ptr, BlockId::test(step));
                model.insert((size, ptr), step);
            }
            let Some((&(size, ptr), _)) = model.range((size, 0)..).next() else {
                continue;
            };
            let slot = p.find(s, size, ptr).expect("in the pool");
            let (nsize, nptr) = (size + 512 * (rand() % 8) as usize, ptr + 512);
            if model.contains_key(&(nsize, nptr)) {
                continue;
            }
            if p.rekey(slot, nsize, nptr, BlockId::test(step)) {
                rekeyed += 1;
                model.remove(&(size, ptr));
                model.insert((nsize, nptr), step);
            } else if rand() % 2 == 0 {
                p.remove_slot(slot);
                model.remove(&(size, ptr));
            }
            let got: Vec<u32> = p.at_least(s, 0).map(|e| e.id.test_index()).collect();
            assert_eq!(
                got,
                model.values().copied().collect::<Vec<_>>(),
                "step {step}"
            );
        }
        assert!(rekeyed > 1000, "only {rekeyed} re-keyed in place");
    }
}
