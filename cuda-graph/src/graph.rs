//! Graphs, captured or built ([`Graph`]), and executable graphs ([`GraphExec`]).

use std::cell::Cell;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use cudars_core::graph::{GraphExecHandle, GraphHandle, InstantiateFlags, UpdateRefusal};
use cudars_core::sys::{CUcontext, CUgraphNode};
use cudars_core::{Device, DevicePtr, Event, Stream};

use crate::builder::node::{NodeId, NodeKind};
use crate::builder::registry::{NodeOwners, NodeTable, Owner};
use crate::error::{BuildError, CaptureId, Error, Result};

/// A graph's driver handle, shared by its [`Graph`] and the executable graphs made from it:
/// the driver names an executable graph's nodes, for node updates, by the nodes of the graph
/// it was instantiated from, so that graph must outlive them. Every driver call that reads
/// or writes the graph, the executable graphs' node updates included (they name its nodes),
/// holds `calls`: the driver does not synchronise calls on one graph ("no API or pair of
/// APIs is guaranteed to be safe to call on the same graph object from two different
/// threads"), and a graph and an executable graph made from it may be on two threads.
#[derive(Debug)]
pub(crate) struct SharedGraph {
    handle: GraphHandle,
    calls: CallLock,
}

impl SharedGraph {
    fn new(handle: GraphHandle) -> Arc<SharedGraph> {
        Arc::new(SharedGraph {
            handle,
            calls: CallLock::default(),
        })
    }

    /// The handle, with the graph's calls serialised while the guard lives.
    pub(crate) fn lock(&self) -> SharedGraphGuard<'_> {
        SharedGraphGuard {
            _calls: self.calls.lock(),
            handle: &self.handle,
        }
    }
}

/// A lock one thread may take again while it holds it: the calls of one thread on a graph are
/// sequential anyway, and a thread holding the bare handle ([`Graph::handle`]) may go on to
/// instantiate the graph or update an executable graph made from it. Other threads wait.
#[derive(Debug, Default)]
struct CallLock {
    /// The holding thread and how many times it holds the lock.
    state: Mutex<Option<(std::thread::ThreadId, usize)>>,
    released: Condvar,
}

impl CallLock {
    fn lock(&self) -> CallGuard<'_> {
        let me = std::thread::current().id();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match &mut *state {
                None => {
                    *state = Some((me, 1));
                    break;
                }
                Some((owner, depth)) if *owner == me => {
                    *depth += 1;
                    break;
                }
                Some(_) => {
                    state = self
                        .released
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
        CallGuard {
            lock: self,
            _not_send: PhantomData,
        }
    }
}

/// One hold of a [`CallLock`]; released on the thread that took it (not `Send`).
struct CallGuard<'a> {
    lock: &'a CallLock,
    _not_send: PhantomData<*const ()>,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        let mut state = self
            .lock
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, depth)) = &mut *state {
            *depth -= 1;
            if *depth == 0 {
                *state = None;
                self.lock.released.notify_one();
            }
        }
    }
}

/// The graph's handle while no other thread's call on the graph runs (see [`SharedGraph`]).
pub(crate) struct SharedGraphGuard<'a> {
    _calls: CallGuard<'a>,
    handle: &'a GraphHandle,
}

impl std::ops::Deref for SharedGraphGuard<'_> {
    type Target = GraphHandle;
    fn deref(&self) -> &GraphHandle {
        self.handle
    }
}

// SAFETY: `GraphHandle` is `Send`, not `Sync`: calls on one graph must not overlap. Every
// call on the handle is made through `lock`, which holds `calls` for the call (the `Graph`'s
// own calls, the bare handle it lends out, and its executable graphs' node updates and
// updates), so no two overlap whatever threads they come from. The last reference's drop
// destroys the graph, with no other reference left to call it.
unsafe impl Sync for SharedGraph {}

/// The bare `cuda-core` handle of a [`Graph`], lent by [`Graph::handle`]: while it lives, no
/// other thread's call on the graph runs (executable graphs made from it, on other threads,
/// wait to update their nodes); this thread's own calls go on. Not `Send`. Dereferences to
/// the handle.
pub struct GraphHandleRef<'a>(SharedGraphGuard<'a>);

impl std::ops::Deref for GraphHandleRef<'_> {
    type Target = GraphHandle;
    fn deref(&self) -> &GraphHandle {
        &self.0
    }
}

impl std::fmt::Debug for GraphHandleRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("GraphHandleRef").field(&**self).finish()
    }
}

/// A graph, captured or built: the recorded work, not yet runnable. Make it runnable with
/// [`Graph::instantiate`]; one graph can be instantiated any number of times.
///
/// The graph is destroyed on drop, or once the last executable graph made from it is dropped
/// (the driver names an executable graph's nodes by those of its graph, for node updates);
/// executable graphs made from it stay valid. `Send`, not `Sync`: the driver does not
/// synchronise calls on one graph, so they must not overlap.
///
/// A graph built with [`GraphBuilder`](crate::GraphBuilder) also knows its nodes (for the
/// node updates of its executable graphs) and keeps alive what they use.
#[derive(Debug)]
pub struct Graph {
    handle: Arc<SharedGraph>,
    /// Not `Sync`, as the handle it calls.
    _not_sync: PhantomData<Cell<()>>,
    capture: Option<CaptureId>,
    table: Arc<NodeTable>,
    owners: Arc<NodeOwners>,
    /// Flags every instantiation adds (auto-free for unfreed allocation nodes).
    extra_flags: InstantiateFlags,
}

impl Graph {
    pub(crate) fn from_capture(handle: GraphHandle, capture: CaptureId) -> Graph {
        Graph {
            handle: SharedGraph::new(handle),
            _not_sync: PhantomData,
            capture: Some(capture),
            table: Arc::default(),
            owners: Arc::default(),
            extra_flags: InstantiateFlags::NONE,
        }
    }

    pub(crate) fn from_parts(
        handle: GraphHandle,
        table: NodeTable,
        owners: NodeOwners,
        extra_flags: InstantiateFlags,
    ) -> Graph {
        Graph {
            handle: SharedGraph::new(handle),
            _not_sync: PhantomData,
            capture: None,
            table: Arc::new(table),
            owners: Arc::new(owners),
            extra_flags,
        }
    }

    /// Wraps a graph handle made elsewhere (with `cudars_core::graph`, say).
    pub fn from_handle(handle: GraphHandle) -> Graph {
        Graph {
            handle: SharedGraph::new(handle),
            _not_sync: PhantomData,
            capture: None,
            table: Arc::default(),
            owners: Arc::default(),
            extra_flags: InstantiateFlags::NONE,
        }
    }

    /// Every owner the nodes of this graph hold (for a graph that embeds it).
    pub(crate) fn all_owners(&self) -> Vec<Owner> {
        self.owners.values().flatten().cloned().collect()
    }

    /// The kind of `node`, when it is a node of this built graph (or of its bodies).
    pub fn node_kind(&self, node: NodeId) -> Option<NodeKind> {
        self.table.nodes.get(&node).map(|e| e.kind)
    }

    /// The capture that recorded this graph (`None` for clones and wrapped handles).
    pub fn capture(&self) -> Option<CaptureId> {
        self.capture
    }

    /// The device the graph runs on (whose stream was captured, or that it was built for).
    pub fn device(&self) -> Device {
        self.handle.handle.device()
    }

    /// The underlying `cuda-core` handle, when it keeps alive everything the graph's nodes
    /// use (a captured or wrapped graph, or a built one whose nodes hold no buffer, closure
    /// or event); `None` for a graph whose nodes hold any (see
    /// [`GraphBuilder`](crate::GraphBuilder)): only this `Graph` keeps those alive, so an
    /// executable graph or clone made through the bare handle could outlive them. `None`
    /// also for a built graph with allocation nodes: an update through the bare handles
    /// would hand their addresses to another executable graph (see
    /// [`GraphExec::try_update`]).
    ///
    /// While the reference lives, no other thread's call on the graph runs: executable graphs
    /// made from it, on other threads, wait to update their nodes (the driver does not
    /// synchronise calls on one graph). This thread may go on using the graph and its
    /// executable graphs meanwhile. Keep it briefly.
    pub fn handle(&self) -> Option<GraphHandleRef<'_>> {
        let allocates = self
            .table
            .nodes
            .values()
            .any(|e| e.kind == NodeKind::MemAlloc);
        if !allocates && self.owners.values().all(Vec::is_empty) {
            Some(GraphHandleRef(self.handle.lock()))
        } else {
            None
        }
    }

    /// Runs `f` with the handle, the graph's calls serialised (for this crate's own calls
    /// that keep the owners alive themselves).
    pub(crate) fn with_core<R>(&self, f: impl FnOnce(&GraphHandle) -> R) -> R {
        f(&self.handle.lock())
    }

    /// Number of nodes: one per captured operation (memset, copy, kernel, event wait, ...) or
    /// added node; the nodes of conditional bodies and child graphs are not counted.
    pub fn node_count(&self) -> Result<usize> {
        Ok(self.handle.lock().node_count()?)
    }

    /// A deep copy, independent of this graph (`cuGraphClone`). It keeps alive what this
    /// graph's nodes use, but its nodes are new: the [`NodeId`]s of this graph do not name
    /// them, so its executable graphs take no node updates.
    pub fn try_clone(&self) -> Result<Graph> {
        Ok(Graph {
            handle: SharedGraph::new(self.handle.lock().clone_graph()?),
            _not_sync: PhantomData,
            capture: None,
            table: Arc::default(),
            owners: Arc::new(
                [(NodeId::clone_marker(), self.all_owners())]
                    .into_iter()
                    .collect(),
            ),
            extra_flags: self.extra_flags,
        })
    }

    /// Writes the graph as a Graphviz DOT file for debugging (`cuGraphDebugDotPrint`);
    /// `verbose` adds each node's parameters. Render with `dot -Tsvg graph.dot -o graph.svg`.
    pub fn write_dot(&self, path: impl AsRef<Path>, verbose: bool) -> Result<()> {
        Ok(self.handle.lock().write_dot(path, verbose)?)
    }

    /// An executable graph, ready to [`launch`](GraphExec::launch).
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.instantiate_with(InstantiateFlags::NONE)
    }

    /// An executable graph made with `flags` (for graphs with allocation nodes,
    /// [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`] frees what a previous launch left allocated).
    pub fn instantiate_with(&self, flags: InstantiateFlags) -> Result<GraphExec> {
        self.instantiate_with_params(flags, None)
    }

    /// An executable graph made with `cuGraphInstantiateWithParams`: `flags`, and `upload`,
    /// the stream [`InstantiateFlags::UPLOAD`] uploads on (that flag is added when `upload`
    /// is given). [`InstantiateFlags::DEVICE_LAUNCH`] makes it launchable from kernels;
    /// such a graph may hold only kernel, copy and memset nodes (the driver refuses others:
    /// [`Error::Instantiate`] names the node it blamed).
    pub fn instantiate_with_params(
        &self,
        flags: InstantiateFlags,
        upload: Option<&Stream>,
    ) -> Result<GraphExec> {
        let flags = if upload.is_some() {
            flags | InstantiateFlags::UPLOAD
        } else {
            flags
        };
        let flags = flags | self.extra_flags;
        let mut blamed: CUgraphNode = std::ptr::null_mut();
        let handle = match upload {
            None if flags.0
                & !(InstantiateFlags::AUTO_FREE_ON_LAUNCH.0
                    | InstantiateFlags::USE_NODE_PRIORITY.0)
                == 0 =>
            {
                self.handle.lock().instantiate(flags)?
            }
            _ => self
                .handle
                .lock()
                .instantiate_with_params(flags, upload, &mut blamed)
                .map_err(|source| Error::Instantiate {
                    node: self.table.by_raw.get(&(blamed as usize)).copied(),
                    source,
                })?,
        };
        Ok(GraphExec::new(handle, flags, self))
    }
}

/// What [`GraphExec::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpdateOutcome {
    /// The executable graph was updated in place (`cuGraphExecUpdate`): cheap.
    Updated,
    /// The driver refused the update for the reason given, so the executable graph was
    /// re-instantiated from the new graph: correct, but costs a full instantiation.
    Reinstantiated(UpdateRefusal),
}

/// An executable graph: launch it on any stream of its device, as often as wanted.
///
/// Destroyed on drop (launches still running finish first: the driver frees it afterwards).
/// `Send`, not `Sync`: launches and updates of one executable graph must not overlap across
/// threads.
///
/// # What it keeps alive
///
/// Everything the nodes of its graph use (see [`GraphBuilder`](crate::GraphBuilder)). A
/// node update ([`set_memcpy`](Self::set_memcpy) and its siblings) or a whole-graph update
/// ([`try_update`](Self::try_update)) takes over the new buffers and closures and lets the
/// old ones go once no launch can use them any more: device buffers at once (each launch
/// recorded its stream on them, so their free or reuse waits for it), host closures, host
/// buffers and events after the last launch has completed (an event recorded after each
/// launch of a graph that holds any says when). Dropping the executable graph waits for that
/// event before it lets them go.
pub struct GraphExec {
    pub(crate) handle: GraphExecHandle,
    /// The graph `handle` was instantiated from: node updates name its nodes.
    pub(crate) source: Arc<SharedGraph>,
    flags: InstantiateFlags,
    table: Arc<NodeTable>,
    owners: NodeOwners,
    /// The device buffers of `owners`, recorded on each launch stream.
    device_owners: Vec<DevicePtr>,
    /// Recorded after each launch once the graph holds (or held) host-side owners.
    fence: std::cell::OnceCell<Event>,
    /// Host-side owners replaced by updates, released when `fence` completes.
    retired: Vec<Owner>,
    /// Whether `owners` holds host-side owners (kept in step with it).
    host_owned: bool,
    /// A launch whose fence record failed: only a device synchronisation covers it.
    unfenced: std::cell::Cell<bool>,
    /// The fences of the executable graphs that re-instantiation replaced (their launches
    /// are not ordered with this one's): `retired` waits for them too.
    old_fences: Vec<Event>,
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec")
            .field("handle", &self.handle)
            .field("flags", &self.flags)
            .field("nodes", &self.table.nodes.len())
            .field(
                "kept_alive",
                &self.owners.values().map(Vec::len).sum::<usize>(),
            )
            .field("retired", &self.retired.len())
            .finish()
    }
}

fn device_owners(owners: &NodeOwners) -> Vec<DevicePtr> {
    owners
        .values()
        .flatten()
        .filter_map(|o| match o {
            Owner::Device(p) => Some(p.clone()),
            Owner::Host(_) => None,
        })
        .collect()
}

fn has_host_owners(owners: &NodeOwners) -> bool {
    owners
        .values()
        .flatten()
        .any(|o| matches!(o, Owner::Host(_)))
}

impl GraphExec {
    fn new(handle: GraphExecHandle, flags: InstantiateFlags, graph: &Graph) -> GraphExec {
        let owners: NodeOwners = (*graph.owners).clone();
        GraphExec {
            handle,
            source: Arc::clone(&graph.handle),
            flags,
            table: Arc::clone(&graph.table),
            device_owners: device_owners(&owners),
            host_owned: has_host_owners(&owners),
            owners,
            fence: std::cell::OnceCell::new(),
            retired: Vec::new(),
            unfenced: std::cell::Cell::new(false),
            old_fences: Vec::new(),
        }
    }

    /// The device it runs on.
    pub fn device(&self) -> Device {
        self.handle.device()
    }

    /// The underlying `cuda-core` handle, when launching through it is sound: when this
    /// executable graph holds no buffer, closure or event for its nodes (a captured graph's,
    /// say, whose memory the core handle keeps itself). `None` otherwise: a launch through
    /// the bare handle would neither record its stream on the buffers nor be waited for
    /// before the closures, host buffers and events are let go.
    pub fn handle(&self) -> Option<&GraphExecHandle> {
        if self.retired.is_empty() && self.owners.values().all(Vec::is_empty) {
            Some(&self.handle)
        } else {
            None
        }
    }

    /// The flags it was instantiated with (kept for re-instantiation by [`GraphExec::update`]).
    pub fn flags(&self) -> InstantiateFlags {
        self.flags
    }

    /// Runs the whole graph on `stream` (CuPy's `Graph.launch`), after the stream's earlier
    /// work and after this graph's earlier launches. Any stream of the graph's device works,
    /// not only the one that was captured; a stream of another device is a `WrongDevice`
    /// error.
    ///
    /// A stream that is being captured (into another graph) is refused, before anything is
    /// issued, with `cudars_core::Error::Unsupported` (in [`Error::Cuda`](crate::Error::Cuda)):
    /// the graph being captured would keep neither this executable graph nor the memory it
    /// uses alive. The capture goes on unharmed.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        if self.device_owners.is_empty() && !self.needs_fence() {
            return Ok(self.handle.launch(stream)?);
        }
        // The fence exists before the launch: a launch of a graph holding host-side owners
        // is always followed by a record of it (or marks the graph unfenced).
        let fence = if self.needs_fence() {
            Some(match self.fence.get() {
                Some(f) => f,
                None => {
                    let f = Event::new(&self.device())?;
                    self.fence.get_or_init(|| f)
                }
            })
        } else {
            None
        };
        let issue = stream.issue(self.device())?;
        if !cudars_core::graph::is_capturing(stream)? {
            for p in &self.device_owners {
                p.record_stream(&issue)?;
            }
        }
        self.handle.launch(stream)?;
        if let Some(fence) = fence {
            if let Err(e) = fence.record(stream) {
                // This launch cannot be waited for through the fence: wait for the whole
                // device before letting host-side owners go.
                self.unfenced.set(true);
                return Err(e.into());
            }
        }
        Ok(())
    }

    fn needs_fence(&self) -> bool {
        self.host_owned || !self.retired.is_empty()
    }

    /// Lets go of retired owners once the last launch has completed.
    fn release_retired(&mut self) {
        if self.retired.is_empty() {
            return;
        }
        let done = !self.unfenced.get()
            && self
                .old_fences
                .iter()
                .all(|f| matches!(f.query(), Ok(true)))
            && match self.fence.get() {
                None => true,
                Some(f) => matches!(f.query(), Ok(true)),
            };
        if done {
            self.retired.clear();
            self.old_fences.clear();
        }
    }

    /// Uploads the graph to the device on `stream` ahead of its first launch, so that launch
    /// does not pay for it (`cuGraphUpload`).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        Ok(self.handle.upload(stream)?)
    }

    /// Replaces the owners of `node` (or of every node) and retires the old host-side ones.
    pub(crate) fn replace_owners(&mut self, node: Option<NodeId>, new: Vec<Owner>) {
        let old: Vec<Owner> = match node {
            Some(n) => {
                let old = if new.is_empty() {
                    self.owners.remove(&n)
                } else {
                    self.owners.insert(n, new)
                };
                old.unwrap_or_default()
            }
            None => Vec::new(),
        };
        self.retired
            .extend(old.into_iter().filter(|o| matches!(o, Owner::Host(_))));
        self.device_owners = device_owners(&self.owners);
        self.host_owned = has_host_owners(&self.owners);
        self.release_retired();
    }

    /// The driver node of `node`, when it is a node of this executable graph's graph of
    /// `kind`.
    pub(crate) fn node(&self, node: NodeId, kind: NodeKind) -> Result<CUgraphNode> {
        let Some(entry) = self.table.nodes.get(&node) else {
            return Err(BuildError::NotInExecutable { node }.into());
        };
        let same = match (entry.kind, kind) {
            (NodeKind::Conditional(_), NodeKind::Conditional(_)) => true,
            (a, b) => a == b,
        };
        if !same {
            return Err(BuildError::WrongKind {
                node,
                expected: kind.name(),
                actual: entry.kind.name(),
            }
            .into());
        }
        Ok(entry.raw as CUgraphNode)
    }

    pub(crate) fn ctx(&self) -> Result<CUcontext> {
        Ok(self.device().primary_context()?)
    }

    /// Makes later launches run `graph` instead, which must have the same shape (the same
    /// nodes and edges; parameters such as memset values, copy addresses or kernel arguments
    /// may differ), with `cuGraphExecUpdate`. A refusal is [`Error::UpdateRefused`]: the
    /// reason, and the node of `graph` the driver blamed; this executable graph is then
    /// unchanged. On success it takes over `graph`'s buffers and closures and lets the old
    /// ones go once no launch uses them. Node updates keep naming the nodes of the graph
    /// this executable graph was instantiated from (the driver knows its nodes by those).
    ///
    /// A `graph` with memory allocation nodes is refused before the driver
    /// ([`UpdateRefusal::NotSupported`], naming its allocation node), unless it is the graph
    /// this executable graph was instantiated from: its copies and memsets use the addresses
    /// of its own allocation nodes, which this executable graph's allocation nodes never map.
    pub fn try_update(&mut self, graph: &Graph) -> Result<()> {
        if graph.device() != self.device() {
            return Err(crate::error::wrong_device(
                "graph",
                self.device(),
                graph.device(),
            ));
        }
        if !Arc::ptr_eq(&graph.table, &self.table) {
            let alloc = graph
                .table
                .nodes
                .iter()
                .filter(|(_, e)| e.kind == NodeKind::MemAlloc)
                .map(|(id, _)| *id)
                .min();
            if let Some(alloc) = alloc {
                return Err(Error::UpdateRefused {
                    refusal: UpdateRefusal::NotSupported,
                    node: Some(alloc),
                    from: None,
                });
            }
        }
        let updated = {
            // The new graph's calls serialised; the executable graph is ours (`&mut self`).
            let source = graph.handle.lock();
            self.handle.update_detailed(&source)?
        };
        match updated {
            Ok(()) => {
                self.adopt(graph, false);
                Ok(())
            }
            Err(failure) => {
                let name = |raw: CUgraphNode| graph.table.by_raw.get(&(raw as usize)).copied();
                Err(Error::UpdateRefused {
                    refusal: failure.refusal,
                    node: name(failure.node),
                    from: name(failure.from_node),
                })
            }
        }
    }

    /// Takes over `graph`'s owners (and its nodes, when re-instantiated from it), retiring
    /// the current owners.
    fn adopt(&mut self, graph: &Graph, reinstantiated: bool) {
        let old = std::mem::replace(&mut self.owners, (*graph.owners).clone());
        self.retired.extend(
            old.into_values()
                .flatten()
                .filter(|o| matches!(o, Owner::Host(_))),
        );
        if reinstantiated {
            self.table = Arc::clone(&graph.table);
        }
        self.device_owners = device_owners(&self.owners);
        self.host_owned = has_host_owners(&self.owners);
        self.release_retired();
    }

    /// Makes later launches run `graph` instead, which must have the same shape (the same
    /// nodes and edges; parameters such as memset values, copy addresses or kernel arguments
    /// may differ).
    ///
    /// Tries `cuGraphExecUpdate` first; when the driver refuses (another topology, a node
    /// type changed, ...), re-instantiates from `graph` with the same flags. The outcome says
    /// which happened. Launches already queued run the old version.
    pub fn update(&mut self, graph: &Graph) -> Result<UpdateOutcome> {
        if graph.device() != self.device() {
            return Err(crate::error::wrong_device(
                "graph",
                self.device(),
                graph.device(),
            ));
        }
        match self.try_update(graph) {
            Ok(()) => Ok(UpdateOutcome::Updated),
            Err(Error::UpdateRefused { refusal, .. }) => {
                self.handle = graph
                    .handle
                    .lock()
                    .instantiate(self.flags | graph.extra_flags)?;
                self.source = Arc::clone(&graph.handle);
                // The old executable graph's launches are not ordered with the new one's:
                // its fence guards what it used.
                if let Some(f) = self.fence.take() {
                    self.old_fences.push(f);
                }
                self.adopt(graph, true);
                Ok(UpdateOutcome::Reinstantiated(refusal))
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // Host closures, host buffers and events may still be used by a launch in flight:
        // wait for the last one before letting them go (leak them if the wait fails).
        let mut waited = true;
        if self.unfenced.get() {
            waited &= self.device().synchronize().is_ok();
        }
        for fence in self.fence.get().into_iter().chain(&self.old_fences) {
            waited &= fence.synchronize().is_ok();
        }
        if !waited {
            std::mem::forget(std::mem::take(&mut self.owners));
            std::mem::forget(std::mem::take(&mut self.retired));
        }
    }
}

#[cfg(test)]
mod call_lock_tests {
    use super::CallLock;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn one_thread_takes_it_again_and_others_wait() {
        let lock = Arc::new(CallLock::default());
        let outer = lock.lock();
        let inner = lock.lock(); // the same thread: no deadlock
        let entered = Arc::new(AtomicBool::new(false));
        let (l2, e2) = (Arc::clone(&lock), Arc::clone(&entered));
        let other = std::thread::spawn(move || {
            let _g = l2.lock();
            e2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !entered.load(Ordering::SeqCst),
            "another thread got in while held"
        );
        drop(inner);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !entered.load(Ordering::SeqCst),
            "released before the outer hold ended"
        );
        drop(outer);
        other.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
    }
}
