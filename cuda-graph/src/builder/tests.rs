//! CPU tests of the builder's checks.

use super::extent::Extent;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudars_core::graph::explicit::ConditionalKind;
use cudars_core::graph::UpdateRefusal;

use super::conditional::SET_CONDITIONAL_PRELUDE;
use super::host::{host_callback, host_trampoline};
use super::memory::GraphAlloc;
use super::node::{NodeId, NodeKind};
use super::operands::{DeviceMem, Mem, Pitched};
use super::registry::Registry;
use super::validate::{check_pitched, copy_size, memset_target};
use crate::error::{describe_refusal, BuildError, Error};

fn reg_with(n: usize) -> Registry {
    let mut r = Registry::new(false);
    for i in 0..n {
        let deps = if i == 0 { vec![] } else { vec![i as u32 - 1] };
        r.push(deps);
    }
    r
}

#[test]
fn nodes_of_another_graph_are_refused() {
    let a = reg_with(2);
    let b = reg_with(1);
    let foreign = b.id(0);
    match a.check_deps(&[a.id(0), foreign]) {
        Err(BuildError::ForeignNode { node, graph }) => {
            assert_eq!(node, foreign);
            assert_eq!(graph, a.graph);
        }
        other => panic!("{other:?}"),
    }
    // A forged index past the end counts as foreign too.
    let forged = NodeId {
        graph: a.graph,
        index: 99,
    };
    assert!(matches!(
        a.check_deps(&[forged]),
        Err(BuildError::ForeignNode { .. })
    ));
    assert_ne!(a.graph, b.graph);
}

#[test]
fn repeated_dependencies_count_once_and_empty_is_fine() {
    let a = reg_with(3);
    assert_eq!(
        a.check_deps(&[a.id(2), a.id(0), a.id(2)]).unwrap(),
        vec![2, 0]
    );
    assert!(a.check_deps(&[]).unwrap().is_empty());
    let empty = Registry::new(false);
    assert_eq!(empty.len(), 0);
    assert!(!empty.has_unfreed());
}

#[test]
fn reachability_follows_transitive_dependencies() {
    let mut r = reg_with(3); // 0 <- 1 <- 2
    let side = r.push(vec![]); // 3, independent
    assert!(r.reaches(&[2], 0));
    assert!(r.reaches(&[2], 2));
    assert!(!r.reaches(&[2], side.index));
    assert!(!r.reaches(&[], 0));
}

#[test]
fn bodies_refuse_host_event_and_memory_nodes() {
    let body = Registry::new(true);
    for kind in [
        NodeKind::Host,
        NodeKind::EventRecord,
        NodeKind::EventWait,
        NodeKind::MemAlloc,
        NodeKind::MemFree,
    ] {
        assert_eq!(
            body.check_kind(kind),
            Err(BuildError::NotAllowedInBody { kind: kind.name() })
        );
    }
    for kind in [
        NodeKind::Kernel,
        NodeKind::Memcpy,
        NodeKind::Memset,
        NodeKind::Empty,
        NodeKind::Child,
        NodeKind::Conditional(ConditionalKind::While),
    ] {
        body.check_kind(kind).unwrap();
    }
    Registry::new(false).check_kind(NodeKind::Host).unwrap();
}

fn alloc_in(r: &mut Registry, deps: Vec<u32>) -> GraphAlloc {
    let node = r.push(deps);
    r.note_alloc(node);
    GraphAlloc {
        ptr: 0x1000,
        len: 64,
        node,
    }
}

#[test]
fn graph_allocations_are_used_in_order_and_freed_after_their_uses() {
    let mut r = Registry::new(false);
    let before = r.push(vec![]);
    let a = alloc_in(&mut r, vec![]);
    // A use must depend on the allocation node.
    assert_eq!(
        r.check_alloc_use(&a, &[before.index]),
        Err(BuildError::NotOrderedAfterAllocation { alloc: a.node })
    );
    r.check_alloc_use(&a, &[a.node.index]).unwrap();
    let user = r.push(vec![a.node.index]);
    r.note_use(&a, user);
    let other = r.push(vec![a.node.index]);
    r.note_use(&a, other);
    // The free must depend on every use.
    assert_eq!(
        r.check_free(&a, &[user.index]),
        Err(BuildError::UseNotBeforeFree { user: other })
    );
    assert!(r.has_unfreed());
    r.check_free(&a, &[user.index, other.index]).unwrap();
    let free = r.push(vec![user.index, other.index]);
    r.note_free(&a, free);
    assert!(!r.has_unfreed());
    // After the free: no use, no second free.
    let err = Err(BuildError::AllocationFreed {
        alloc: a.node,
        free,
    });
    assert_eq!(r.check_alloc_use(&a, &[free.index]), err);
    assert_eq!(r.check_free(&a, &[free.index]), err);
    // Another graph's allocation.
    let other_graph = Registry::new(false);
    assert!(matches!(
        other_graph.check_alloc_use(&a, &[]),
        Err(BuildError::ForeignAllocation { .. })
    ));
}

#[test]
fn memset_and_copy_shapes_are_checked() {
    let reg = Registry::new(false);
    let a = GraphAlloc {
        ptr: 0x1002,
        len: 6,
        node: reg.id(0),
    };
    assert_eq!(
        memset_target(&DeviceMem::Alloc(&a), 1).unwrap(),
        (0x1002, 6)
    );
    assert_eq!(
        memset_target(&DeviceMem::Alloc(&a), 2).unwrap(),
        (0x1002, 3)
    );
    assert!(matches!(
        memset_target(&DeviceMem::Alloc(&a), 4),
        Err(Error::Build(BuildError::Misaligned { element: 4, .. }))
    ));
    let empty = GraphAlloc { len: 0, ..a };
    assert!(matches!(
        memset_target(&DeviceMem::Alloc(&empty), 1),
        Err(Error::Build(BuildError::Empty { .. }))
    ));
    let b = GraphAlloc { len: 8, ..a };
    assert!(matches!(
        copy_size(&Mem::from(&a), &Mem::from(&b)),
        Err(Error::Cuda(cudars_core::Error::SizeMismatch {
            dst: 6,
            src: 8,
            ..
        }))
    ));
    assert_eq!(copy_size(&Mem::from(&a), &Mem::from(&a)).unwrap(), 6);
    assert!(matches!(
        copy_size(&Mem::from(&empty), &Mem::from(&empty)),
        Err(Error::Build(BuildError::Empty { .. }))
    ));
}

#[test]
fn pitched_copies_stay_inside_both_buffers() {
    let reg = Registry::new(false);
    let alloc = |len| GraphAlloc {
        ptr: 0x1000,
        len,
        node: reg.id(0),
    };
    let (big, small) = (alloc(4096), alloc(1000));
    let e = Extent {
        width: 100,
        height: 10,
        depth: 2,
    };
    // 2 slices of 16 rows of 128 bytes: (1 * 16 + 9) * 128 + 100 = 3300 bytes needed.
    let ok = Pitched::new(&big, 128, 16);
    check_pitched(&ok, &ok, e).unwrap();
    assert!(matches!(
        check_pitched(&Pitched::new(&small, 128, 16), &ok, e),
        Err(Error::Cuda(cudars_core::Error::OutOfRange {
            len: 3300,
            size: 1000,
            ..
        }))
    ));
    assert!(matches!(
        check_pitched(&Pitched::new(&big, 64, 16), &ok, e),
        Err(Error::Build(BuildError::BadPitch {
            end: "destination",
            ..
        }))
    ));
    assert!(matches!(
        check_pitched(&ok, &Pitched::new(&big, 128, 4), e),
        Err(Error::Build(BuildError::BadPitch { end: "source", .. }))
    ));
    // A 2-D copy does not look at the rows per slice.
    let flat = Extent { depth: 1, ..e };
    check_pitched(&ok, &Pitched::new(&big, 128, 0), flat).unwrap();
    assert!(matches!(
        check_pitched(&ok, &ok, Extent { width: 0, ..e }),
        Err(Error::Build(BuildError::Empty { .. }))
    ));
    let huge = Extent {
        width: 1,
        height: 2,
        depth: usize::MAX,
    };
    assert!(matches!(
        check_pitched(&ok, &ok, huge),
        Err(Error::Cuda(cudars_core::Error::SizeOverflow(_)))
    ));
}

#[test]
fn errors_name_nodes_and_reasons() {
    let r = reg_with(1);
    let e = BuildError::ForeignNode {
        node: r.id(0),
        graph: 5,
    };
    assert_eq!(
        e.to_string(),
        format!(
            "node #0 of graph #{} belongs to another graph than graph #5",
            r.graph
        )
    );
    let text = describe_refusal(UpdateRefusal::TopologyChanged, Some(r.id(0)), None);
    assert!(text.contains("the topology changed"), "{text}");
    assert!(text.contains("at node #0"), "{text}");
    let e = Error::UpdateRefused {
        refusal: UpdateRefusal::ParametersChanged,
        node: None,
        from: None,
    };
    assert!(e.to_string().contains("parameters changed"), "{e}");
    assert!(SET_CONDITIONAL_PRELUDE.contains("cudaGraphSetConditional"));
    assert_eq!(ConditionalKind::Switch(3).bodies(), 3);
    assert_eq!(ConditionalKind::IfElse.bodies(), 2);
    assert!(ConditionalKind::IfElse.min_driver() > ConditionalKind::While.min_driver());
}

#[test]
fn host_callbacks_run_and_panics_are_caught() {
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    let (cb, data) = host_callback(move || {
        if h.fetch_add(1, Ordering::SeqCst) == 1 {
            panic!("second call panics");
        }
    });
    for _ in 0..3 {
        // SAFETY: `data` points at `cb`, alive here.
        unsafe { host_trampoline(data) };
    }
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    drop(cb);
}
