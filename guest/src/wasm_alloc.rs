//! The component's allocator: power-of-two size classes, one free list each.
//!
//! Allocation and free are O(1) and the code is a few hundred bytes. dlmalloc
//! costs ~6 KB of the 100 KB budget; lol_alloc's first-fit free list is as small
//! but made a decision cost 16 µs instead of 8 µs (`cargo bench --bench decision`).
//! Freed blocks are never coalesced, but a request of 4 KiB or more that finds
//! its class empty splits a larger free block (buddy-style halves) before it
//! grows memory, and so does any request when memory cannot grow: freed memory
//! is reused across sizes, so a long-lived instance accepts what a fresh one
//! does (bodies of 20, 10, 5, 2.5 and 1.25 MB in turn once exhausted the 64 MiB
//! cap: every size class took fresh memory).

use core::alloc::{GlobalAlloc, Layout};
use core::arch::wasm32::memory_grow;
use core::cell::UnsafeCell;
use core::ptr::null_mut;

const PAGE: usize = 65_536;
/// Blocks are aligned to their size up to this; larger alignments are refused.
const MAX_ALIGN: usize = 4096;
/// Grow memory by at least this many pages at a time.
const GROW_PAGES: usize = 16;
/// The smallest class (2^12 = 4 KiB) that splits a larger free block before it
/// grows memory (smaller ones do only when memory cannot grow: the search is
/// not worth it on the decision path).
const SPLIT_FROM_CLASS: usize = 12;

struct State {
    /// Free blocks of 2^k bytes, linked through their first word.
    free: [*mut u8; usize::BITS as usize],
    /// The unused tail of the memory grown so far.
    next: usize,
    end: usize,
}

pub struct SizeClasses(UnsafeCell<State>);

// SAFETY: a component instance runs on one thread; nothing here spawns threads.
unsafe impl Sync for SizeClasses {}

impl SizeClasses {
    pub const fn new() -> Self {
        SizeClasses(UnsafeCell::new(State { free: [null_mut(); usize::BITS as usize], next: 0, end: 0 }))
    }
}

impl State {
    /// Takes a free block of class `k` by splitting the smallest larger free
    /// block: its lower 2^k bytes are returned, the upper halves (2^k, 2^(k+1),
    /// ...) go to their classes' free lists. Alignment holds: a block of 2^j is
    /// aligned to min(2^j, MAX_ALIGN), and each half's offset is a multiple of its size.
    fn split_larger(&mut self, k: usize) -> *mut u8 {
        let Some(j) = (k + 1..self.free.len()).find(|&j| !self.free[j].is_null()) else { return null_mut() };
        let block = self.free[j];
        // SAFETY: a free block stores the next free block of its class in its first word.
        self.free[j] = unsafe { *(block as *mut *mut u8) };
        for i in (k..j).rev() {
            // SAFETY: the upper half of a 2^(i+1) piece of `block`, inside the block.
            let half = unsafe { block.add(1 << i) };
            unsafe { *(half as *mut *mut u8) = self.free[i] };
            self.free[i] = half;
        }
        block
    }
}

/// The class of a layout: its size rounded up to a power of two (at least a word).
fn class(layout: Layout) -> Option<(usize, usize)> {
    let size = layout.size().max(layout.align()).max(core::mem::size_of::<usize>()).checked_next_power_of_two()?;
    Some((size.trailing_zeros() as usize, size))
}

unsafe impl GlobalAlloc for SizeClasses {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > MAX_ALIGN {
            return null_mut();
        }
        let Some((k, size)) = class(layout) else { return null_mut() };
        // SAFETY: single-threaded (see `Sync`), and no reentrancy: nothing below allocates.
        let state = unsafe { &mut *self.0.get() };
        let head = state.free[k];
        if !head.is_null() {
            // SAFETY: a free block of this class stores the next free block in its first word.
            state.free[k] = unsafe { *(head as *mut *mut u8) };
            return head;
        }
        if k >= SPLIT_FROM_CLASS {
            let block = state.split_larger(k);
            if !block.is_null() {
                return block;
            }
        }
        let align = size.min(MAX_ALIGN);
        let start = (state.next + align - 1) & !(align - 1);
        if start.checked_add(size).is_none_or(|end| end > state.end) {
            let pages = size.div_ceil(PAGE).saturating_add(1).max(GROW_PAGES);
            let previous = memory_grow(0, pages);
            if previous == usize::MAX {
                // The host's memory cap: reuse a larger free block if there is one,
                // else the caller aborts and the host sees a trap.
                return state.split_larger(k);
            }
            let region = previous * PAGE;
            if region != state.end {
                // Someone else grew memory in between: start afresh in the new region.
                state.next = region;
            }
            state.end = region + pages * PAGE;
            return unsafe { self.alloc(layout) };
        }
        state.next = start + size;
        start as *mut u8
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Growing within the block's class needs no move.
        let same_class = Layout::from_size_align(new_size, layout.align()).ok().and_then(class).map(|(k, _)| k) == class(layout).map(|(k, _)| k);
        if same_class {
            return ptr;
        }
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else { return null_mut() };
        let new_ptr = unsafe { self.alloc(new_layout) };
        if !new_ptr.is_null() {
            unsafe {
                core::ptr::copy_nonoverlapping(ptr, new_ptr, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new_ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some((k, _)) = class(layout) else { return };
        // SAFETY: single-threaded; `ptr` is a block of this class that the caller gives up.
        let state = unsafe { &mut *self.0.get() };
        unsafe { *(ptr as *mut *mut u8) = state.free[k] };
        state.free[k] = ptr;
    }
}
