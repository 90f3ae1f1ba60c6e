//! Handles: [`TensorId`] (what a user holds), [`StorageId`] (the unit of eviction:
//! one allocation shared by a tensor and its views) and [`OpId`] (a compute path).

use std::fmt;

/// A user-held tensor handle: one name for a view of a storage.
///
/// Invariant: `index` addresses a slot of the runtime's tensor slab and `generation`
/// equals the slot's generation while the handle is live, so a stale handle (used
/// after its last [`crate::Runtime::release`]) is reported as
/// [`crate::Error::UnknownTensor`] instead of aliasing a newer tensor.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl TensorId {
    /// The slab index (stable while the handle is live; reused afterwards).
    pub fn index(self) -> u32 {
        self.index
    }
}

impl fmt::Debug for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}g{}", self.index, self.generation)
    }
}

/// A storage: the bytes behind a tensor and all its views; the unit of eviction.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct StorageId(pub(crate) u32);

impl StorageId {
    /// The slab index of this storage.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// A compute path: an op handle, its input storages, its fresh output storages.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct OpId(pub(crate) u32);

impl OpId {
    /// The slab index of this compute path.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// A slab of records with a free list; indices are reused after removal.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    entries: Vec<Option<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        self.len += 1;
        if let Some(i) = self.free.pop() {
            self.entries[i as usize] = Some(value);
            i
        } else {
            self.entries.push(Some(value));
            (self.entries.len() - 1) as u32
        }
    }

    pub(crate) fn remove(&mut self, i: u32) -> Option<T> {
        let v = self.entries.get_mut(i as usize)?.take();
        if v.is_some() {
            self.len -= 1;
            self.free.push(i);
        }
        v
    }

    #[inline]
    pub(crate) fn get(&self, i: u32) -> Option<&T> {
        self.entries.get(i as usize).and_then(Option::as_ref)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.entries.get_mut(i as usize).and_then(Option::as_mut)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|v| (i as u32, v)))
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    #[inline]
    fn index(&self, i: u32) -> &T {
        match self.get(i) {
            Some(v) => v,
            None => panic!("slab index {i} is vacant: this is a bug in remat-dtr"),
        }
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, i: u32) -> &mut T {
        match self.get_mut(i) {
            Some(v) => v,
            None => panic!("slab index {i} is vacant: this is a bug in remat-dtr"),
        }
    }
}
