//! The component's allocator: power-of-two size classes, one free list each.
//!
//! Allocation and free are O(1) and the code is a few hundred bytes. dlmalloc
//! costs ~6 KB of the 100 KB budget; lol_alloc's first-fit free list is as small
//! but made a decision cost 16 µs instead of 8 µs (`cargo bench --bench decision`).
//! Freed blocks are reused only by requests of the same class and never
//! coalesced: the heap holds at most the peak use of each class, which for a
//! policy (short strings, a few vectors) is small.

use core::alloc::{GlobalAlloc, Layout};
use core::arch::wasm32::memory_grow;
use core::cell::UnsafeCell;
use core::ptr::null_mut;

const PAGE: usize = 65_536;
/// Blocks are aligned to their size up to this; larger alignments are refused.
const MAX_ALIGN: usize = 4096;
/// Grow memory by at least this many pages at a time.
const GROW_PAGES: usize = 16;

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
        let align = size.min(MAX_ALIGN);
        let start = (state.next + align - 1) & !(align - 1);
        if start.checked_add(size).is_none_or(|end| end > state.end) {
            let pages = size.div_ceil(PAGE).saturating_add(1).max(GROW_PAGES);
            let previous = memory_grow(0, pages);
            if previous == usize::MAX {
                return null_mut(); // the host's memory cap: the caller aborts, the host sees a trap
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
