//! Locking a `std::sync` lock whatever a panicking holder left behind.
//!
//! A lock is poisoned when a thread panics while holding it. The standard library then refuses
//! every later `lock()` with an error, and `lock().unwrap()` would turn one panic (already
//! caught and restarted by the hive's supervision) into a panic in every later holder: a
//! connection, a node actor, the admin endpoint, the process. edgehive's locks guard state that
//! each critical section updates without calling anything that can panic half-way (a map
//! insert or remove, a field or whole-entry assignment, a counter), so the data behind a
//! poisoned lock is consistent and is used as is. A lock whose critical section could leave
//! its data torn must not use these helpers. Public so extension modules (the `edgehive`
//! crate's Router) take their locks the same one way (`actors/tests/invariants.rs`).

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `mutex.lock()`, taking the guard from a poisoned lock (see the module docs).
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lock.read()`, taking the guard from a poisoned lock (see the module docs).
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lock.write()`, taking the guard from a poisoned lock (see the module docs).
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder that panics does not stop the next one: it sees what was written before.
    #[test]
    fn a_panicking_holder_leaves_the_lock_usable() {
        let mutex = Mutex::new(1);
        let rw = RwLock::new(1);
        let _ = std::panic::catch_unwind(|| {
            let mut value = lock(&mutex);
            *value = 2;
            let mut other = write(&rw);
            *other = 2;
            panic!("holder panics");
        });
        assert!(mutex.is_poisoned() && rw.is_poisoned());
        assert_eq!(*lock(&mutex), 2);
        assert_eq!(*read(&rw), 2);
        *write(&rw) = 3;
        assert_eq!(*read(&rw), 3);
    }
}
