//! Conditional nodes: [`ConditionalHandle`], if, if/else, while and switch, and the
//! builders of their bodies.

use std::marker::PhantomData;

use cudars_core::graph::explicit::{self as ex, ConditionalKind};
use cudars_core::sys::CUgraph;
use cudars_core::Device;

use super::graph_builder::GraphBuilder;
use super::node::{NodeId, NodeKind};
use super::registry::{NodeOwners, NodeTable, Registry};
use crate::error::{BuildError, Result};

/// CUDA C++ that declares the device-side `cudaGraphSetConditional` and the handle type for
/// a program compiled with NVRTC: put it at the top of the source of the kernel that sets a
/// condition. (`nvcc` programs get both from `cuda_runtime.h`.)
///
/// ```
/// let source = format!(
///     "{}\nextern \"C\" __global__ void keep_going(cudaGraphConditionalHandle h, const int* left) {{\n    cudaGraphSetConditional(h, *left > 0);\n}}\n",
///     cudars_graph::SET_CONDITIONAL_PRELUDE
/// );
/// assert!(source.contains("cudaGraphSetConditional(h"));
/// ```
pub const SET_CONDITIONAL_PRELUDE: &str = "typedef unsigned long long cudaGraphConditionalHandle;\n\
extern \"C\" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);\n";

/// A condition handle for a conditional node of one graph
/// ([`GraphBuilder::conditional_handle`]). Pass [`raw`](Self::raw) to the kernel that sets
/// the condition, as an `unsigned long long` (`cudaGraphConditionalHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConditionalHandle {
    pub(crate) raw: u64,
    pub(crate) graph: u64,
}

impl ConditionalHandle {
    /// The driver's handle: the kernel argument.
    pub fn raw(self) -> u64 {
        self.raw
    }

    /// The graph it belongs to.
    pub fn graph(self) -> u64 {
        self.graph
    }
}

impl<'a> GraphBuilder<'a> {
    /// A condition handle for a conditional node of this graph (this builder: a body's own
    /// conditional nodes need a handle of that body). With `default`, each launch starts
    /// with the condition at that value; without, the condition is whatever a kernel last
    /// set, so a kernel must set it before the node reads it. Needs a CUDA 12.3 driver
    /// (`DriverTooOld` otherwise). Every handle should drive a conditional node: the driver
    /// may refuse to instantiate a graph with a handle that drives none.
    pub fn conditional_handle(&mut self, default: Option<u32>) -> Result<ConditionalHandle> {
        ex::require_conditional(ConditionalKind::If)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph of this builder and its device's context.
        let raw = unsafe { ex::conditional_handle_create(self.graph(), self.ctx(), default) }?;
        Ok(ConditionalHandle {
            raw,
            graph: self.reg.graph,
        })
    }

    /// A conditional node of `kind`; `fill(i, body)` fills body `i` (0-based).
    ///
    /// When `fill` fails (or panics), its error is returned, but the conditional node stays
    /// in the graph with the nodes its bodies got so far, whose buffers and closures the
    /// graph keeps alive like any other node's: do not launch a graph whose build failed
    /// half-way unless that partial body is what you want.
    pub fn add_conditional(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        kind: ConditionalKind,
        mut fill: impl FnMut(usize, &mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        if handle.graph != self.reg.graph {
            return Err(BuildError::ForeignHandle {
                handle_graph: handle.graph,
                graph: self.reg.graph,
            }
            .into());
        }
        let nk = NodeKind::Conditional(kind);
        let (idx, raw) = self.prepare(deps, nk)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; the handle was made for this graph (checked
        // above); the device's context.
        let (node, bodies) =
            unsafe { ex::add_conditional_node(self.graph(), &raw, handle.raw, kind, self.ctx()) }?;
        let id = self.record(idx, node, nk, Vec::new());
        let anchor = ();
        for (i, body) in bodies.into_iter().enumerate() {
            // The nodes a body gets stay in the graph even when its closure fails or panics
            // (the conditional node is already in the graph, and the builder stays usable):
            // the guard hands their owners to this builder on every path, so no later launch
            // reaches a buffer or closure dropped with the body's builder.
            let mut guard = BodyGuard {
                table: &mut self.table,
                owners: &mut self.owners,
                body: Self::body_builder(self.device, self.ctx, body, &anchor),
            };
            let expected = guard.body.reg.graph;
            fill(i, &mut guard.body)?;
            if guard.body.reg.graph != expected || guard.body.handle.is_some() {
                return Err(BuildError::BodyReplaced.into());
            }
        }
        Ok(id)
    }

    fn body_builder<'b>(
        device: Device,
        ctx: usize,
        raw: CUgraph,
        _anchor: &'b (),
    ) -> GraphBuilder<'b> {
        GraphBuilder {
            handle: None,
            raw: raw as usize,
            device,
            ctx,
            reg: Registry::new(true),
            table: NodeTable::default(),
            owners: NodeOwners::new(),
            _body: PhantomData,
        }
    }

    /// An if node: `then` runs when the condition is nonzero (CUDA 12.3).
    pub fn add_if(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        then: impl FnOnce(&mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        let mut then = Some(then);
        self.add_conditional(deps, handle, ConditionalKind::If, |_, b| {
            match then.take() {
                Some(f) => f(b),
                None => Ok(()),
            }
        })
    }

    /// An if/else node: `then` runs when the condition is nonzero, `otherwise` when it is
    /// zero (CUDA 12.8).
    pub fn add_if_else(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        then: impl FnOnce(&mut GraphBuilder<'_>) -> Result<()>,
        otherwise: impl FnOnce(&mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        let (mut then, mut otherwise) = (Some(then), Some(otherwise));
        self.add_conditional(deps, handle, ConditionalKind::IfElse, |i, b| {
            if i == 0 {
                then.take().map_or(Ok(()), |f| f(b))
            } else {
                otherwise.take().map_or(Ok(()), |f| f(b))
            }
        })
    }

    /// A while node: `body` runs again and again while the condition is nonzero, checked
    /// before each iteration (so zero iterations when it starts at zero). Something in the
    /// body (or before the node, for the first check) must set the condition, or the loop
    /// never ends (CUDA 12.3).
    pub fn add_while(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        body: impl FnOnce(&mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        let mut body = Some(body);
        self.add_conditional(deps, handle, ConditionalKind::While, |_, b| {
            match body.take() {
                Some(f) => f(b),
                None => Ok(()),
            }
        })
    }

    /// A while node whose body runs `steps` loop steps per iteration, chained: the
    /// while-loop's own cost (about 4.7 us an iteration on driver 580, against about 1.5 us a
    /// chained step) is paid once per `steps` steps. `step(i, body, after)` adds step `i`
    /// (0-based) to the body after the nodes `after` and returns its last node.
    ///
    /// The exit is still decided on the device after each step: every step must check the
    /// loop's condition itself (a counter, a residual), do nothing once it says stop, and set
    /// the handle's condition as a plain while body would (the last step's setting decides
    /// whether another iteration runs). The steps after the exit in the same iteration still
    /// launch, as no-ops: up to `steps - 1` wasted launches at the end. It pays when a step is
    /// short (a few microseconds) and the loop runs many iterations; for long steps the
    /// while-loop's cost is noise and `steps = 1` ([`add_while`](Self::add_while)) wastes
    /// nothing. `steps` is at least 1 (`InvalidArgument` otherwise, nothing added).
    pub fn add_while_steps(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        steps: u32,
        mut step: impl FnMut(u32, &mut GraphBuilder<'_>, &[NodeId]) -> Result<NodeId>,
    ) -> Result<NodeId> {
        if steps == 0 {
            return Err(cudars_core::Error::InvalidArgument(
                "add_while_steps: at least one step per iteration".into(),
            )
            .into());
        }
        self.add_while(deps, handle, |body| {
            let mut after = Vec::new();
            for i in 0..steps {
                after = vec![step(i, body, &after)?];
            }
            Ok(())
        })
    }

    /// A switch node of `cases` bodies: body `n` runs when the condition is `n`, none when it
    /// is `cases` or more (CUDA 12.8). `fill(n, body)` fills body `n`.
    pub fn add_switch(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        cases: u32,
        fill: impl FnMut(usize, &mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        self.add_conditional(deps, handle, ConditionalKind::Switch(cases), fill)
    }
}

/// Hands a conditional body's nodes and owners to its parent builder when dropped, whether
/// the body's closure returned, failed or panicked.
struct BodyGuard<'p, 'b> {
    pub(crate) table: &'p mut NodeTable,
    pub(crate) owners: &'p mut NodeOwners,
    pub(crate) body: GraphBuilder<'b>,
}

impl Drop for BodyGuard<'_, '_> {
    fn drop(&mut self) {
        self.table.nodes.extend(self.body.table.nodes.drain());
        self.table.by_raw.extend(self.body.table.by_raw.drain());
        self.owners.extend(self.body.owners.drain());
    }
}
