//! The pinned host allocator on a real GPU (feature `cuda`): for both pinning
//! modes (`cuMemHostAlloc`, and `malloc` + `cuMemHostRegister`), a block's
//! bytes reach device memory through an asynchronous copy on a side stream,
//! the block is reused only after that copy's event, and `empty_cache`
//! unpins everything.
//!
//! Where GPU 0 cannot be opened (no driver, no GPU) the test prints
//! `skipping …` and passes.
#![cfg(feature = "cuda")]

use remat_alloc::device::Device;
use remat_alloc::host::{CachingHostAllocator, CudaHostProvider};
use remat_alloc::{AllocatorConfig, StreamId};

#[test]
fn pinned_blocks_feed_async_copies_and_wait_for_their_events() {
    for settings in [
        "pinned_use_cuda_host_register:False",
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
    ] {
        let provider = match CudaHostProvider::new(0) {
            Ok(p) => p,
            Err(e) => {
                println!("skipping pinned_blocks_feed_async_copies: no CUDA device ({e})");
                return;
            }
        };
        let cfg = AllocatorConfig::parse(settings).unwrap();
        let host = CachingHostAllocator::from_config(provider, &cfg).unwrap();
        assert_eq!(
            host.options().use_host_register,
            settings.contains("True"),
            "{settings}"
        );
        let len = 3 << 20;
        let block = host.allocate(len).unwrap();
        assert_eq!(block.size(), 4 << 20);
        let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        host.write_bytes(&block, 0, &pattern).unwrap();
        let side = StreamId(1);
        let dst = host.with_provider(|p| {
            let dev = p.device();
            let dst = dev.allocate(len).unwrap();
            let stream = dev.raw_stream(side).unwrap();
            // SAFETY: the block is live and holds `len` initialised bytes;
            // nothing writes it until the copy's event completes (it is only
            // freed, and reused after the event); `dst` is a live device
            // segment of `len` bytes on this context.
            unsafe {
                let src = std::slice::from_raw_parts(block.ptr() as usize as *const u8, len);
                cudarc::driver::result::memcpy_htod_async(dst, src, stream).unwrap();
            }
            dst
        });
        host.record_event(&block, side).unwrap();
        let ptr = block.ptr();
        host.free(block).unwrap();
        // Either the copy already finished (then the block is reused) or
        // it is pending (then a new block is pinned): never both.
        let again = host.allocate(len).unwrap();
        let stats = host.stats();
        if again.ptr() == ptr {
            assert_eq!(stats.num_host_alloc, 1);
        } else {
            assert_eq!(stats.num_host_alloc, 2);
        }
        host.free(again).unwrap();
        let back = host.with_provider(|p| {
            let dev = p.device();
            dev.synchronize().unwrap();
            let back = dev.read_bytes(dst, len).unwrap();
            dev.free(dst, len).unwrap();
            back
        });
        assert!(
            back == pattern,
            "{settings}: the copy did not carry the bytes"
        );
        host.empty_cache().unwrap();
        assert_eq!(host.pinned_bytes(), 0, "{settings}");
        assert_eq!(host.stats().active_requests.current, 0);
    }
}
