//! A growable list whose growth never copies more than one chunk: elements
//! live in chunks of at most 64 KiB (a power of two of elements), and a full
//! chunk is followed by a new one instead of being copied into one twice its
//! size. Only the first chunk grows by copying, from one element to full size.
//!
//! A run's calls used to be one `Vec`. Doubling it copied every call (one
//! `begin-call` cost 5.8 M fuel at the 65,537th call), and under the
//! component's power-of-two allocator the old and the new buffer together
//! exhausted the 64 MiB memory cap at 131,072 calls, whatever
//! `max-steps-per-run` allowed. Chunks cost one allocation per 64 KiB, freed
//! memory is reused at its own size, and a run with one call still takes one
//! element's room.

use alloc::vec::Vec;
use core::ops::{Index, IndexMut};

/// The bytes of a full chunk: the allocator's 64 KiB size class, exactly.
const CHUNK_BYTES: usize = 65_536;

#[derive(Clone, Debug)]
pub struct Chunked<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked { chunks: Vec::new(), len: 0 }
    }
}

impl<T> Chunked<T> {
    /// Elements a chunk holds: a power of two, so that finding an element is
    /// a shift and a mask (every decision finds its call).
    const PER_CHUNK: usize = {
        let size = core::mem::size_of::<T>();
        if size == 0 || size >= CHUNK_BYTES { 1 } else { 1 << (CHUNK_BYTES / size).ilog2() }
    };

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    // One bounds check and pointer arithmetic: every decision finds its call
    // several times, and at the component's size optimisation each checked
    // `get` of the two levels would be a call.
    pub fn get(&self, index: usize) -> Option<&T> {
        if index >= self.len {
            return None;
        }
        // SAFETY: `index < len`, and every chunk before the last is full
        // (`push` only appends), so the chunk exists and holds the element.
        unsafe {
            let chunk = &*self.chunks.as_ptr().add(index / Self::PER_CHUNK);
            Some(&*chunk.as_ptr().add(index % Self::PER_CHUNK))
        }
    }

    pub fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        if index >= self.len {
            return None;
        }
        // SAFETY: as in `get`.
        unsafe {
            let chunk = &mut *self.chunks.as_mut_ptr().add(index / Self::PER_CHUNK);
            Some(&mut *chunk.as_mut_ptr().add(index % Self::PER_CHUNK))
        }
    }

    /// Appends `value`. The first chunk grows from one element by doubling
    /// (most runs make a few calls); every later chunk is allocated full size.
    pub fn push(&mut self, value: T) {
        let per_chunk = Self::PER_CHUNK;
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < per_chunk => {
                if chunk.len() == chunk.capacity() {
                    chunk.reserve_exact(chunk.len().min(per_chunk - chunk.len()));
                }
                chunk.push(value);
            }
            _ => {
                let mut chunk = Vec::with_capacity(if self.chunks.is_empty() { 1 } else { per_chunk });
                chunk.push(value);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        (0..self.len()).filter_map(move |i| self.get(i))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.chunks.iter_mut().flatten()
    }
}

impl<T> Index<usize> for Chunked<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        self.get(index).expect("an index within the list")
    }
}

impl<T> IndexMut<usize> for Chunked<T> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        self.get_mut(index).expect("an index within the list")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_a_vec_holds_across_chunks() {
        let mut list = Chunked::<u64>::default();
        let per_chunk = Chunked::<u64>::PER_CHUNK;
        assert_eq!(per_chunk, 8192);
        let n = 3 * per_chunk + 5;
        for i in 0..n {
            list.push(i as u64);
            assert_eq!(list.len(), i + 1);
        }
        assert!((0..n).all(|i| list[i] == i as u64));
        assert_eq!(list.get(n), None);
        list[per_chunk] = 7;
        assert_eq!(list[per_chunk], 7);
        assert_eq!(list.iter_mut().count(), n);
        // Full chunks are exactly 64 KiB; the first grew to exactly its size.
        assert!(list.chunks.iter().rev().skip(1).all(|c| c.capacity() == per_chunk));
        assert_eq!(list.chunks.len(), 4);
    }

    #[test]
    fn a_single_element_takes_one_element_of_room() {
        let mut list = Chunked::<[u8; 100]>::default();
        assert!(list.is_empty());
        list.push([0; 100]);
        assert_eq!(list.chunks[0].capacity(), 1);
        for _ in 0..1000 {
            list.push([1; 100]);
        }
        assert!(list.chunks.iter().all(|c| c.capacity() <= Chunked::<[u8; 100]>::PER_CHUNK));
    }
}
