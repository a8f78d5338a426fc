//! Fast, non-cryptographic randomness for the data path (P2C balancing picks, backoff jitter):
//! a per-thread `SmallRng`, so a pick takes no lock and no system call. Seeded once per thread
//! from the operating system so proxies (and threads) do not share a sequence.

use std::cell::RefCell;

use rand::SeedableRng;
use rand::rngs::SmallRng;

thread_local! {
    static RNG: RefCell<SmallRng> = RefCell::new({
        let mut seed = <SmallRng as SeedableRng>::Seed::default();
        cnimesh_identity::tls::random(seed.as_mut());
        SmallRng::from_seed(seed)
    });
}

/// Runs `f` with this thread's generator.
pub fn with<T>(f: impl FnOnce(&mut SmallRng) -> T) -> T {
    RNG.with(|r| f(&mut r.borrow_mut()))
}
