//! What every fuzz target shares: an allocator that refuses to hold more than
//! [`LIVE_LIMIT`] bytes at once.
//!
//! libFuzzer's `-malloc_limit_mb` only sees allocations through a sanitizer's hooks, and the
//! stable toolchain has no sanitizer, so the limit is enforced here: past it an allocation
//! fails, Rust reports "memory allocation of N bytes failed" and aborts, and libFuzzer saves
//! the input as a crash. No target's input (at most `-max_len`, 1 MiB in `run.sh`) may make
//! a decoder hold this much. `-rss_limit_mb` backs it up.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most bytes the process may hold at once (libFuzzer's own corpus included).
pub const LIVE_LIMIT: usize = 512 * 1024 * 1024;

/// [`System`], failing allocations that would take the live total past [`LIVE_LIMIT`].
pub struct CappedAlloc;

static LIVE: AtomicUsize = AtomicUsize::new(0);

impl CappedAlloc {
    fn reserve(size: usize) -> bool {
        let before = LIVE.fetch_add(size, Ordering::Relaxed);
        if before.saturating_add(size) > LIVE_LIMIT {
            LIVE.fetch_sub(size, Ordering::Relaxed);
            return false;
        }
        true
    }
}

// SAFETY: every call is passed to `System` unchanged; only the byte count is kept.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        let ptr = unsafe { System.alloc(layout) };
        if ptr.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if ptr.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !Self::reserve(new_size - old) {
            return std::ptr::null_mut();
        }
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if new.is_null() {
            if new_size > old {
                LIVE.fetch_sub(new_size - old, Ordering::Relaxed);
            }
        } else if new_size < old {
            LIVE.fetch_sub(old - new_size, Ordering::Relaxed);
        }
        new
    }
}

/// Declares [`CappedAlloc`] the target's allocator.
#[macro_export]
macro_rules! capped_allocator {
    () => {
        #[global_allocator]
        static ALLOC: $crate::CappedAlloc = $crate::CappedAlloc;
    };
}
