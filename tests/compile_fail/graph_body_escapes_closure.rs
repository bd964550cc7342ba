// A conditional node's body builder works on a graph owned by the node: it cannot leave the
// closure that fills the body (it would outlive the graph it writes into).
use cudars_graph::GraphBuilder;

fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let mut g = GraphBuilder::new(&dev).unwrap();
    let h = g.conditional_handle(None).unwrap();
    let mut escaped = None;
    g.add_while(&[], h, |body| {
        escaped = Some(body);
        Ok(())
    })
    .unwrap();
    drop(g);
    let _ = escaped;
}
