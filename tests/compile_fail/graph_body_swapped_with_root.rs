// A body's builder cannot trade places with a graph's own builder (which could then be kept,
// and used, after the graph that owns the body is gone): the lifetimes do not unify.
use cudars_graph::GraphBuilder;

fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let mut g = GraphBuilder::new(&dev).unwrap();
    let mut other = GraphBuilder::new(&dev).unwrap();
    let h = g.conditional_handle(None).unwrap();
    g.add_while(&[], h, |body| {
        std::mem::swap(body, &mut other);
        Ok(())
    })
    .unwrap();
}
