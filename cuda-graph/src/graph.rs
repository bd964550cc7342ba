//! Captured graphs ([`Graph`]) and executable graphs ([`GraphExec`]).

use std::path::Path;

use cudars_core::graph::{GraphExecHandle, GraphHandle, InstantiateFlags, UpdateRefusal};
use cudars_core::{Device, Stream};

use crate::error::{CaptureId, Result};

/// A captured graph: the recorded work, not yet runnable. Make it runnable with
/// [`Graph::instantiate`]; one graph can be instantiated any number of times.
///
/// The graph is destroyed on drop; executable graphs made from it stay valid. `Send`, not
/// `Sync`: the driver does not synchronise calls on one graph, so they must not overlap.
#[derive(Debug)]
pub struct Graph {
    handle: GraphHandle,
    capture: Option<CaptureId>,
}

impl Graph {
    pub(crate) fn from_capture(handle: GraphHandle, capture: CaptureId) -> Graph {
        Graph {
            handle,
            capture: Some(capture),
        }
    }

    /// Wraps a graph handle made elsewhere (with `cudars_core::graph`, say).
    pub fn from_handle(handle: GraphHandle) -> Graph {
        Graph {
            handle,
            capture: None,
        }
    }

    /// The capture that recorded this graph (`None` for clones and wrapped handles).
    pub fn capture(&self) -> Option<CaptureId> {
        self.capture
    }

    /// The device whose stream was captured.
    pub fn device(&self) -> Device {
        self.handle.device()
    }

    /// The underlying `cuda-core` handle.
    pub fn handle(&self) -> &GraphHandle {
        &self.handle
    }

    /// Number of nodes: one per captured operation (memset, copy, kernel, event wait, ...).
    pub fn node_count(&self) -> Result<usize> {
        Ok(self.handle.node_count()?)
    }

    /// A deep copy, independent of this graph (`cuGraphClone`).
    pub fn try_clone(&self) -> Result<Graph> {
        Ok(Graph {
            handle: self.handle.clone_graph()?,
            capture: None,
        })
    }

    /// Writes the graph as a Graphviz DOT file for debugging (`cuGraphDebugDotPrint`);
    /// `verbose` adds each node's parameters. Render with `dot -Tsvg graph.dot -o graph.svg`.
    pub fn write_dot(&self, path: impl AsRef<Path>, verbose: bool) -> Result<()> {
        Ok(self.handle.write_dot(path, verbose)?)
    }

    /// An executable graph, ready to [`launch`](GraphExec::launch).
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.instantiate_with(InstantiateFlags::NONE)
    }

    /// An executable graph made with `flags` (for graphs with allocation nodes,
    /// [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`] frees what a previous launch left allocated).
    pub fn instantiate_with(&self, flags: InstantiateFlags) -> Result<GraphExec> {
        Ok(GraphExec {
            handle: self.handle.instantiate(flags)?,
            flags,
        })
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
#[derive(Debug)]
pub struct GraphExec {
    handle: GraphExecHandle,
    flags: InstantiateFlags,
}

impl GraphExec {
    /// The device it runs on.
    pub fn device(&self) -> Device {
        self.handle.device()
    }

    /// The underlying `cuda-core` handle.
    pub fn handle(&self) -> &GraphExecHandle {
        &self.handle
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
        Ok(self.handle.launch(stream)?)
    }

    /// Uploads the graph to the device on `stream` ahead of its first launch, so that launch
    /// does not pay for it (`cuGraphUpload`).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        Ok(self.handle.upload(stream)?)
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
            return Err(cudars_core::Error::WrongDevice {
                what: "graph",
                expected: self.device().ordinal(),
                actual: graph.device().ordinal(),
            }
            .into());
        }
        match self.handle.update(&graph.handle)? {
            Ok(()) => Ok(UpdateOutcome::Updated),
            Err(refusal) => {
                self.handle = graph.handle.instantiate(self.flags)?;
                Ok(UpdateOutcome::Reinstantiated(refusal))
            }
        }
    }
}
