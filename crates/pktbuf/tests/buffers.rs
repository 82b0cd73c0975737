//! Pools, caches, chains, shared and external segments.

use std::sync::Arc;

use memnic_pktbuf::{ExtPool, Mbuf, Mempool, PoolCache, PoolConfig, SegKind, DEFAULT_HEADROOM};
use memnic_shm::Region;

fn pool(n: u32, shared: bool) -> Mempool {
    let mut cfg = PoolConfig::new("t", n);
    cfg.cache_size = 4;
    cfg.huge = false;
    cfg.shared = shared;
    Mempool::new(&cfg).unwrap()
}

/// A peer's region with a byte pattern, and an external pool over it.
fn peer_region(len: usize) -> Arc<Region> {
    let r = Region::memfd("peer", len, false).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
    r.write_bytes(0, &bytes).unwrap();
    Arc::new(r)
}

fn filled(p: &Mempool, bytes: &[u8]) -> Mbuf {
    let mut m = p.alloc().unwrap();
    assert!(m.set_len(bytes.len()));
    assert!(m.copy_in(0, bytes));
    m
}

#[test]
fn alloc_free_returns_every_buffer() {
    let pool = pool(32, false);
    let mut c = pool.cache();
    let mut v = Vec::new();
    assert_eq!(c.alloc_up_to(&mut v, 40), 32);
    assert!(c.alloc().is_none());
    let mut idx: Vec<u32> = v.iter().map(|m| m.index()).collect();
    idx.sort();
    idx.dedup();
    assert_eq!(idx.len(), 32, "every buffer handed out once");
    c.free_all(&mut v);
    c.flush();
    assert_eq!(pool.shared_free(), 32);
}

/// A cache made with its own size parks up to twice that, whatever the pool's size.
#[test]
fn a_cache_of_its_own_size_parks_up_to_twice_that() {
    let pool = pool(64, false);
    let mut small = pool.cache_sized(2);
    let mut v = Vec::new();
    assert_eq!(pool.cache().alloc_up_to(&mut v, 10), 10);
    // The pool's own caches park 4..8; this one spills at 4 back to 2.
    for m in v.drain(..3) {
        small.free(m);
    }
    assert_eq!(small.len(), 3);
    small.free(v.pop().unwrap());
    assert_eq!(small.len(), 2);
    let before = pool.shared_free();
    let mut big = pool.cache();
    for m in v.drain(..) {
        big.free(m);
    }
    assert_eq!(big.len(), 6, "the pool's size (4) spills only at 8");
    assert_eq!(pool.shared_free(), before);
}

/// A generator's burst: buffers that already hold `len` bytes, or none when `len` is past the
/// data room; freed, they come back empty.
#[test]
fn alloc_len_up_to_hands_out_buffers_of_that_length() {
    for shared in [false, true] {
        let pool = pool(8, shared);
        let room = pool.data_room() as usize;
        let mut c = pool.cache();
        let mut v = Vec::new();
        assert_eq!(c.alloc_len_up_to(&mut v, 5, room + 1), 0);
        assert!(v.is_empty());
        assert_eq!(c.alloc_len_up_to(&mut v, 5, 60), 5);
        assert_eq!(c.alloc_len_up_to(&mut v, 5, room), 3, "the pool runs dry");
        let lens: Vec<(usize, usize, usize)> = v
            .iter()
            .map(|m| (m.len(), m.data_len(), m.nb_segs()))
            .collect();
        assert_eq!(
            lens,
            [[(60, 60, 1)].repeat(5), [(room, room, 1)].repeat(3)].concat()
        );
        c.free_all(&mut v);
        assert_eq!(c.alloc_up_to(&mut v, 8), 8);
        assert!(v.iter().all(|m| m.is_empty()), "shared {shared}");
    }
}

/// The receive fast path: only a lone private buffer is handed out as a slice, and only
/// within its room; anything else is refused without a change.
#[test]
fn fill_slice_only_for_a_lone_private_buffer_within_its_room() {
    let private = pool(4, false);
    let room = private.data_room() as usize;
    let mut m = private.alloc().unwrap();
    let dst = m.fill_slice(60, 64).expect("private, lone, in room");
    assert_eq!(dst.len(), 64);
    dst.fill(7);
    assert_eq!((m.len(), m.data_len()), (60, 60));
    assert_eq!(m.to_vec(), vec![7u8; 60]);
    assert!(m.fill_slice(61, 60).is_none(), "n below len");
    assert!(m.fill_slice(10, room + 1).is_none(), "past the room");
    assert_eq!(m.len(), 60, "refusals change nothing");
    let mut chain = filled(&private, &[1; 10]);
    assert!(chain.chain(filled(&private, &[2; 10])).is_ok());
    assert!(chain.fill_slice(5, 5).is_none(), "a chain");
    let shared = pool(4, true);
    let mut s = shared.alloc().unwrap();
    assert!(s.fill_slice(5, 5).is_none(), "peer-visible memory");
    assert_eq!(s.len(), 0);
}

#[test]
fn buffers_do_not_overlap_and_keep_their_bytes() {
    let pool = pool(8, false);
    let mut c = pool.cache();
    let mut v = Vec::new();
    c.alloc_up_to(&mut v, 8);
    for (i, m) in v.iter_mut().enumerate() {
        let room = m.capacity();
        assert!(m.set_len(room));
        m.as_mut_slice().unwrap().fill(i as u8);
    }
    for (i, m) in v.iter().enumerate() {
        assert!(m.as_slice().unwrap().iter().all(|&b| b == i as u8));
    }
    drop(v); // the slow path also returns buffers
    drop(c);
    assert_eq!(pool.shared_free(), 8);
}

#[test]
fn headroom_tailroom_and_bounds() {
    let pool = pool(1, false);
    let mut m = pool.alloc().unwrap();
    assert_eq!(m.headroom(), DEFAULT_HEADROOM as usize);
    assert_eq!(m.capacity(), pool.data_room() as usize);
    assert!(!m.set_len(m.capacity() + 1));
    m.append(10).unwrap().copy_from_slice(b"0123456789");
    m.prepend(2).unwrap().copy_from_slice(b"ab");
    assert_eq!(m.as_slice().unwrap(), b"ab0123456789");
    assert!(m.adj(3));
    assert_eq!(m.to_vec(), b"123456789");
    assert!(m.prepend(10_000).is_none());
    assert!(m.append(1 << 20).is_none());
    assert!(!m.adj(100));
    m.reset();
    assert!(m.is_empty());
}

/// `free_front` frees the burst's first `n` packets and keeps the rest, in order, at the front;
/// a burst of this pool's lone buffers and one with a foreign buffer or a chain in it end the
/// same way (every buffer home once), and a cache pushed past twice its size spills.
#[test]
fn free_front_frees_the_first_n_and_keeps_the_rest() {
    let pool = pool(32, false);
    let mut c = pool.cache_sized(4);
    let mut v = Vec::new();
    assert_eq!(c.alloc_up_to(&mut v, 12), 12);
    let kept: Vec<u32> = v[5..].iter().map(|m| m.index()).collect();
    c.free_front(&mut v, 5);
    assert_eq!(v.iter().map(|m| m.index()).collect::<Vec<_>>(), kept);
    // The burst's allocation left 4 parked (it took 16 for 12); 4 + 5 passed twice the
    // cache's size, so it spilled back to 4.
    assert_eq!(c.len(), 4);
    assert_eq!(pool.shared_free(), 32 - 16 + 5);
    c.free_front(&mut v, 100);
    assert!(v.is_empty());
    assert_eq!(c.len(), 4);
    c.flush();
    assert_eq!(pool.shared_free(), 32, "every buffer home once");

    let other = self::pool(4, false);
    let mut v = Vec::new();
    assert_eq!(c.alloc_up_to(&mut v, 3), 3);
    v.insert(1, other.alloc().unwrap());
    let mut head = c.alloc().unwrap();
    head.chain(c.alloc().unwrap()).unwrap();
    v.push(head);
    let last = c.alloc().unwrap();
    let last_idx = last.index();
    v.push(last);
    c.free_front(&mut v, 5);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].index(), last_idx);
    c.free_all(&mut v);
    c.flush();
    assert_eq!(
        pool.shared_free(),
        32,
        "a chain's segments and the lone buffers home once"
    );
    assert_eq!(
        other.shared_free(),
        4,
        "the foreign buffer went to its own pool"
    );
}

#[test]
fn foreign_buffers_go_home() {
    let a = pool(4, false);
    let b = pool(4, false);
    let mut ca = a.cache();
    let m = b.alloc().unwrap();
    assert!(!a.owns(&m) && b.owns(&m));
    ca.free(m);
    ca.flush();
    assert_eq!(b.shared_free(), 4);
    assert_eq!(a.shared_free(), 4);
}

#[test]
fn outstanding_buffer_outlives_its_pool_handle() {
    let pool = pool(2, false);
    let mut m = pool.alloc().unwrap();
    drop(pool);
    assert!(m.set_len(4));
    m.as_mut_slice().unwrap().copy_from_slice(b"live");
    assert_eq!(m.as_slice().unwrap(), b"live");
}

#[test]
fn caches_on_two_threads_share_one_pool() {
    let pool = pool(64, false);
    let mut handles = Vec::new();
    for _ in 0..2 {
        let p = pool.clone();
        handles.push(std::thread::spawn(move || {
            let mut c = p.cache();
            let mut v = Vec::new();
            for _ in 0..1000 {
                c.alloc_up_to(&mut v, 16);
                c.free_all(&mut v);
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(pool.shared_free(), 64);
}

#[test]
fn shared_pool_buffers_are_never_slices() {
    let p = pool(2, true);
    assert!(p.is_shared());
    let mut m = p.alloc().unwrap();
    assert_eq!(m.kind(), SegKind::Shared);
    assert!(m.set_len(8));
    assert!(m.as_slice().is_none() && m.as_mut_slice().is_none());
    assert!(m.append(1).is_none() && m.prepend(1).is_none());
    assert!(m.copy_in(0, b"peerview"));
    // What the peer sees in the memfd is what we wrote, at region_offset.
    let mut seen = [0u8; 8];
    p.region().read_bytes(m.region_offset(), &mut seen).unwrap();
    assert_eq!(&seen, b"peerview");
    // A peer write shows up in our copies.
    p.region().write_bytes(m.region_offset(), b"PEER").unwrap();
    assert_eq!(m.to_vec(), b"PEERview");
}

#[test]
fn a_chain_is_one_packet_across_segments() {
    // A 9000-byte frame over 2 KiB buffers: five segments, one packet.
    let p = pool(8, false);
    let frame: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
    let room = p.data_room() as usize;
    let mut chunks = frame.chunks(room);
    let mut head = filled(&p, chunks.next().unwrap());
    for c in chunks {
        head.chain(filled(&p, c)).unwrap();
    }
    assert_eq!(head.nb_segs(), 9000usize.div_ceil(room));
    assert_eq!(head.len(), 9000);
    assert_eq!(head.data_len(), room);
    assert_eq!(head.to_vec(), frame);
    assert_eq!(head.segments().map(|s| s.data_len()).sum::<usize>(), 9000);
    // A range that crosses a segment boundary, in and out.
    let mut mid = [0u8; 100];
    assert!(head.copy_out(room - 50, &mut mid));
    assert_eq!(&mid[..], &frame[room - 50..room + 50]);
    assert!(head.copy_in(room - 2, b"XYZW"));
    assert_eq!(&head.to_vec()[room - 2..room + 2], b"XYZW");
    assert!(!head.copy_out(8999, &mut [0; 2]), "past the end");
    assert!(!head.set_len(10), "set_len is for lone segments");
    // The tail taken off is a packet of its own.
    let tail = head.take_next().unwrap();
    assert_eq!((head.nb_segs(), head.len()), (1, room));
    assert_eq!(tail.len(), 9000 - room);
    let mut c = p.cache();
    c.free(head);
    c.free(tail);
    c.flush();
    assert_eq!(p.shared_free(), 8, "every segment back once");
}

#[test]
fn long_chain_drops_without_recursion() {
    let p = pool(20_000, false);
    let mut head = p.alloc().unwrap();
    for _ in 1..20_000 {
        head.chain(p.alloc().unwrap()).unwrap();
    }
    assert_eq!(head.nb_segs(), 20_000);
    drop(head);
    assert_eq!(p.shared_free(), 20_000);
}

#[test]
fn external_segments_are_read_only_and_complete_once() {
    let region = peer_region(1 << 16);
    let mut ext = ExtPool::new("q0", 4);
    let m = ext.attach(&region, 100, 64, 7).unwrap();
    assert_eq!(m.kind(), SegKind::External);
    assert_eq!(m.len(), 64);
    assert!(m.as_slice().is_none());
    let want: Vec<u8> = (100..164).map(|i| (i * 7) as u8).collect();
    assert_eq!(m.to_vec(), want);
    let mut m = m;
    assert!(!m.copy_in(0, b"no"), "read-only");
    assert!(!m.set_len(10));
    assert_eq!(ext.outstanding(), 1);
    let mut tags = Vec::new();
    assert_eq!(ext.reap(&mut tags), 0, "not freed yet");
    drop(m);
    assert_eq!(ext.reap(&mut tags), 1);
    assert_eq!(tags, [7]);
    assert_eq!(ext.reap(&mut tags), 0, "completed once");
    assert_eq!(ext.outstanding(), 0);
    // Bounds: a range past the region's end is refused, nothing attached.
    assert!(ext.attach(&region, (1 << 16) - 10, 11, 1).is_err());
    assert_eq!(ext.outstanding(), 0);
}

#[test]
fn external_pool_runs_out_and_refills() {
    let region = peer_region(4096);
    let mut ext = ExtPool::new("q0", 2);
    let a = ext.attach(&region, 0, 10, 1).unwrap();
    let b = ext.attach(&region, 10, 10, 2).unwrap();
    assert!(ext.attach(&region, 20, 10, 3).is_err());
    drop(b);
    let mut tags = Vec::new();
    ext.reap(&mut tags);
    let c = ext.attach(&region, 20, 10, 3).unwrap();
    drop((a, c));
    ext.reap(&mut tags);
    assert_eq!(tags, [2, 1, 3]);
}

#[test]
fn borrowed_segment_never_enters_a_pool() {
    let region = peer_region(4096);
    let p = pool(4, false);
    let mut ext = ExtPool::new("q0", 4);
    let mut c = p.cache();
    let before = (p.shared_free(), c.len());
    c.free(ext.attach(&region, 0, 60, 11).unwrap());
    c.flush();
    assert_eq!(
        p.shared_free(),
        before.0 + before.1 as u32,
        "pool unchanged"
    );
    let mut tags = Vec::new();
    ext.reap(&mut tags);
    assert_eq!(tags, [11]);
    // Allocations never hand out the external slot.
    let mut v = Vec::new();
    c.alloc_up_to(&mut v, 4);
    assert!(v.iter().all(|m| m.kind() == SegKind::Private));
}

/// Every order in which a three-segment chain (pool + external + external) can be taken apart
/// and freed: each external segment completes exactly once, the pool gets its buffer back.
#[test]
fn chain_freed_in_any_order_completes_each_segment_once() {
    let region = peer_region(4096);
    let p = pool(4, false);
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for order in orders {
        for via_cache in [false, true] {
            let mut ext = ExtPool::new("q", 4);
            let mut head = filled(&p, b"head");
            head.chain(ext.attach(&region, 0, 100, 1).unwrap()).unwrap();
            head.chain(ext.attach(&region, 200, 50, 2).unwrap())
                .unwrap();
            assert_eq!((head.nb_segs(), head.len()), (3, 154));
            let mut second = head.take_next().unwrap();
            let third = second.take_next().unwrap();
            let mut segs = [Some(head), Some(second), Some(third)];
            let mut c = p.cache();
            for i in order {
                let s = segs[i].take().unwrap();
                if via_cache {
                    c.free(s);
                } else {
                    drop(s);
                }
            }
            c.flush();
            let mut tags = Vec::new();
            ext.reap(&mut tags);
            tags.sort();
            assert_eq!(tags, [1, 2], "order {order:?}");
            assert_eq!(p.shared_free(), 4);
        }
    }
    // Freed whole, through a cache of another pool.
    let mut ext = ExtPool::new("q", 4);
    let mut head = filled(&p, b"h");
    head.chain(ext.attach(&region, 0, 10, 5).unwrap()).unwrap();
    head.chain(ext.attach(&region, 10, 10, 6).unwrap()).unwrap();
    let other = pool(2, false);
    let mut oc = other.cache();
    oc.free(head);
    oc.flush();
    let mut tags = Vec::new();
    ext.reap(&mut tags);
    assert_eq!(tags, [5, 6]);
    assert_eq!((p.shared_free(), other.shared_free()), (4, 2));
}

#[test]
fn completions_from_other_threads_arrive_once() {
    let region = peer_region(1 << 16);
    let mut ext = ExtPool::new("q", 256);
    let mut total = Vec::new();
    for round in 0..50u64 {
        let segs: Vec<Mbuf> = (0..256)
            .map(|i| {
                ext.attach(&region, i * 64, 64, round * 1000 + i as u64)
                    .unwrap()
            })
            .collect();
        let (a, b): (Vec<_>, Vec<_>) = segs.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
        let t1 = std::thread::spawn(move || drop(a));
        let t2 = std::thread::spawn(move || drop(b));
        t1.join().unwrap();
        t2.join().unwrap();
        let mut tags = Vec::new();
        assert_eq!(ext.reap(&mut tags), 256);
        tags.sort();
        let want: Vec<u64> = (0..256).map(|i| round * 1000 + i).collect();
        assert_eq!(tags, want);
        total.extend(tags);
    }
    assert_eq!(ext.outstanding(), 0);
    assert_eq!(total.len(), 50 * 256);
}

#[test]
fn external_pool_dropped_with_segments_out_keeps_their_memory() {
    let region = peer_region(4096);
    let mut ext = ExtPool::new("q", 2);
    let m = ext.attach(&region, 8, 8, 1).unwrap();
    let want = m.to_vec();
    drop(ext);
    drop(region); // the slot still holds the region: it stays mapped
    assert_eq!(m.to_vec(), want);
    drop(m); // completes into the leaked pool: no crash
}

#[test]
fn regions_are_released_when_idle() {
    let region = peer_region(4096);
    let weak = Arc::downgrade(&region);
    let mut ext = ExtPool::new("q", 2);
    let m = ext.attach(&region, 0, 8, 1).unwrap();
    drop(region);
    assert!(ext.release_idle_regions(), "a segment is out");
    assert!(weak.upgrade().is_some());
    drop(m);
    ext.reap(&mut Vec::new());
    assert!(!ext.release_idle_regions());
    assert!(
        weak.upgrade().is_none(),
        "unmapped once nothing points into it"
    );
}

#[test]
fn copy_on_write_head() {
    let region = peer_region(4096);
    let p = pool(4, false);
    let mut c = p.cache();
    let mut ext = ExtPool::new("q", 4);
    let mut m = ext.attach(&region, 0, 80, 9).unwrap();
    m.chain(ext.attach(&region, 1000, 20, 10).unwrap()).unwrap();
    let before = m.to_vec();
    assert!(m.make_head_private(&mut c));
    assert_eq!(m.kind(), SegKind::Private);
    assert_eq!((m.nb_segs(), m.to_vec()), (2, before.clone()));
    m.as_mut_slice().unwrap()[0..6].copy_from_slice(b"MACMAC");
    assert_eq!(
        region.slice(0, 6).unwrap().read_array::<6>(0).unwrap(),
        before[..6],
        "peer memory untouched"
    );
    let mut tags = Vec::new();
    ext.reap(&mut tags);
    assert_eq!(tags, [9], "the copied head completed at once");
    c.free(m);
    ext.reap(&mut tags);
    assert_eq!(tags, [9, 10]);
    // A shared head is copied too; a private one is left alone.
    let sp = pool(2, true);
    let mut s = filled(&sp, b"shared!");
    assert!(s.make_head_private(&mut c));
    assert_eq!(
        (s.kind(), s.to_vec()),
        (SegKind::Private, b"shared!".to_vec())
    );
    drop(s);
    c.flush(); // the shared head was freed into `c`, which returns other pools' buffers in batches
    assert_eq!(sp.shared_free(), 2);
}

#[test]
fn fill_and_padded_copies() {
    let src_r = Region::memfd("src", 4096, false).unwrap();
    src_r.write_bytes(0, &[5u8; 96]).unwrap();
    for shared in [false, true] {
        let p = pool(2, shared);
        let mut m = p.alloc().unwrap();
        // Padded receive: 64 bytes copied for a 50-byte frame.
        assert!(m.fill_from(&src_r.slice(0, 64).unwrap(), 50));
        assert_eq!(m.to_vec(), [5u8; 50]);
        assert!(
            !m.fill_from(&src_r.slice(0, 64).unwrap(), 65),
            "len past src"
        );
        let dst = Region::private(4096, false).unwrap();
        assert!(m.copy_padded_to(&dst.slice(0, 64).unwrap()));
        assert!(!m.copy_padded_to(&dst.slice(0, 49).unwrap()));
        let mut out = [0u8; 51];
        dst.read_bytes(0, &mut out).unwrap();
        assert_eq!(out[..50], [5u8; 50]);
    }
}

/// `as_slice_padded` gives a lone private segment's bytes rounded up within its buffer, and
/// nothing for a shorter length, past the capacity, a chain or a buffer a peer sees.
#[test]
fn as_slice_padded_only_for_a_lone_private_segment_within_its_buffer() {
    let p = pool(8, false);
    let m = filled(&p, &[7u8; 40]);
    let cap = m.capacity();
    let s = m.as_slice_padded(64).expect("private, 64 <= capacity");
    assert_eq!(s.len(), 64);
    assert_eq!(&s[..40], &[7u8; 40]);
    assert!(m.as_slice_padded(39).is_none(), "shorter than the frame");
    assert!(m.as_slice_padded(cap + 1).is_none(), "past the buffer");
    assert_eq!(m.as_slice_padded(cap).map(<[u8]>::len), Some(cap));
    let mut head = filled(&p, &[1u8; 40]);
    head.chain(filled(&p, &[2u8; 40])).unwrap();
    assert!(head.as_slice_padded(96).is_none(), "a chain");
    let shared = pool(8, true);
    assert!(
        filled(&shared, &[3u8; 40]).as_slice_padded(64).is_none(),
        "a shared buffer"
    );
}

/// The lcore caches of one pool used on one thread share their buffers: what one frees is
/// what the next allocates (the buffer just freed, still in this core's caches). A plain cache
/// keeps its own.
#[test]
fn lcore_caches_on_one_thread_share_their_buffers() {
    let pool = pool(64, false);
    let mut queue = pool.lcore_cache_sized(2);
    let mut stream = pool.lcore_cache();
    let mut plain = pool.cache();
    // Whether `queue`'s next buffer is the one it allocated and `other` then freed (the buffer
    // allocated last is dropped: back to the pool).
    let next_is_freed = |queue: &mut PoolCache, other: &mut PoolCache| {
        let m = queue.alloc().unwrap();
        let idx = m.index();
        other.free(m);
        queue.alloc().map(|m| m.index()) == Some(idx)
    };
    for _ in 0..100 {
        assert!(next_is_freed(&mut queue, &mut stream), "the one just freed");
    }
    assert!(
        !next_is_freed(&mut queue, &mut plain),
        "a plain cache keeps its own"
    );
    assert_eq!(queue.len(), stream.len(), "one shelf");
    drop((queue, stream, plain));
    assert_eq!(
        pool.shared_free(),
        64,
        "every buffer back once the caches are gone"
    );
}

/// Lcore caches on different threads do not share, a cache moved to another thread uses that
/// thread's shelf, and a thread's shelf returns its buffers when its last cache goes.
#[test]
fn lcore_caches_keep_each_thread_to_its_own_shelf() {
    let pool = pool(64, false);
    // Caches of 16: 8 buffers out and back stay on the shelf (no spill to the pool).
    let mut here = pool.lcore_cache_sized(16);
    let mut v = Vec::new();
    assert_eq!(here.alloc_up_to(&mut v, 8), 8);
    let freed: Vec<u32> = v.iter().map(|m| m.index()).collect();
    here.free_all(&mut v);
    let there = {
        let p = pool.clone();
        std::thread::spawn(move || {
            let mut c = p.lcore_cache_sized(16);
            let mut v = Vec::new();
            c.alloc_up_to(&mut v, 8);
            let got: Vec<u32> = v.iter().map(|m| m.index()).collect();
            c.free_all(&mut v);
            (got, c)
        })
        .join()
        .unwrap()
    };
    let (got, mut moved) = there;
    assert!(
        got.iter().all(|i| !freed.contains(i)),
        "another thread's shelf: {got:?} vs {freed:?}"
    );
    // The other thread is gone: its cache, used here, takes this thread's shelf (the one
    // `here` filled) and the old shelf's buffers go back to the pool.
    let m = moved.alloc().unwrap();
    assert!(freed.contains(&m.index()), "this thread's shelf");
    drop(m);
    assert_eq!(moved.len(), here.len());
    drop(moved);
    assert!(!here.is_empty(), "the shelf stays with its last cache");
    drop(here);
    assert_eq!(pool.shared_free(), 64);
}
