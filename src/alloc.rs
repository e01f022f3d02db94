//! The process's allocator: mimalloc for the processes that run a cloud (`cloud`, `demo`, and
//! the load tool `edgehive-loadtest`, whose binary includes this file), the system's malloc for
//! everything else (an edge above all).
//!
//! Why two: in a cloud, blocks are allocated on one thread and freed on another all the time
//! (a frame decoded by a session and dropped by a node actor, an event built by a node actor
//! and dropped by SyncController). glibc's malloc spends about a sixth of a broadcast's CPU on
//! that; mimalloc's per-thread heaps deliver 1.4x to 1.6x as much (BENCHMARKS.md). But
//! mimalloc commits about 10 MiB up front, which would more than double what an idle edge of
//! this binary holds of its own, so an edge keeps the system's allocator.
//!
//! How: [`use_mimalloc`] is called once, at the start of `main`, before any thread exists;
//! from then on new blocks come from mimalloc. A block is always freed (or resized) by the
//! allocator it came from: mimalloc knows its own blocks (`mi_is_in_heap_region`, a lookup in
//! its page map), so the few blocks the runtime made before `main` go back to the system's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

use mimalloc::MiMalloc;

/// Whether new blocks come from mimalloc. Only ever goes from false to true. Soundness does
/// not depend on when another thread sees it: each block is freed by its owner whichever way
/// it was allocated, so `Relaxed` suffices.
static MIMALLOC: AtomicBool = AtomicBool::new(false);

/// From now on, allocate with mimalloc. Call at the start of `main`, before any thread.
pub fn use_mimalloc() {
    MIMALLOC.store(true, Ordering::Relaxed);
}

/// The global allocator of the `edgehive` binary (with the `cloud` feature) and of
/// `edgehive-loadtest`.
pub struct ProcessAllocator;

/// Whether `ptr` is a block of mimalloc's. Never true while mimalloc is not in use, so an
/// edge never asks it.
fn mimalloc_owns(ptr: *mut u8) -> bool {
    // SAFETY: `mi_is_in_heap_region` only reads mimalloc's page map; any pointer is allowed.
    MIMALLOC.load(Ordering::Relaxed) && unsafe { libmimalloc_sys::mi_is_in_heap_region(ptr.cast()) }
}

// SAFETY: every block is allocated by exactly one of two sound allocators and is freed or
// resized by the same one (see `mimalloc_owns`); layouts are passed through unchanged.
unsafe impl GlobalAlloc for ProcessAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if MIMALLOC.load(Ordering::Relaxed) {
            // SAFETY: the caller's contract, passed on.
            unsafe { MiMalloc.alloc(layout) }
        } else {
            // SAFETY: as above.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if MIMALLOC.load(Ordering::Relaxed) {
            // SAFETY: the caller's contract, passed on.
            unsafe { MiMalloc.alloc_zeroed(layout) }
        } else {
            // SAFETY: as above.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mimalloc_owns(ptr) {
            // SAFETY: `ptr` came from mimalloc with `layout`.
            unsafe { MiMalloc.dealloc(ptr, layout) }
        } else {
            // SAFETY: `ptr` came from the system's allocator with `layout`.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if mimalloc_owns(ptr) {
            // SAFETY: `ptr` came from mimalloc with `layout`.
            unsafe { MiMalloc.realloc(ptr, layout, new_size) }
        } else {
            // SAFETY: `ptr` came from the system's allocator with `layout`; the block stays
            // the system's.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary's unit tests run with this allocator too; this is the only one, so switching
    /// it on here changes nothing else.
    #[test]
    fn blocks_are_freed_and_grown_by_the_allocator_they_came_from() {
        let from_system: Vec<u64> = (0..1_000).collect();
        assert!(!mimalloc_owns(from_system.as_ptr().cast_mut().cast()));
        use_mimalloc();
        let from_mimalloc: Vec<u64> = (0..1_000).collect();
        // SAFETY: only reads mimalloc's page map.
        let system_block_in_mimalloc =
            unsafe { libmimalloc_sys::mi_is_in_heap_region(from_system.as_ptr().cast()) };
        assert!(
            !system_block_in_mimalloc,
            "a block from before stays the system's"
        );
        assert!(mimalloc_owns(from_mimalloc.as_ptr().cast_mut().cast()));
        // Growing a block from before the switch keeps it with the system's allocator.
        let mut grown = from_system;
        grown.extend(0..100_000);
        assert!(!mimalloc_owns(grown.as_mut_ptr().cast()));
        assert_eq!(grown[999], 999);
        assert_eq!(from_mimalloc.iter().sum::<u64>(), 499_500);
        drop(grown);
        drop(from_mimalloc);
    }
}
