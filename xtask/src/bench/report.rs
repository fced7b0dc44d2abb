//! The suite's outputs: a markdown table, CSV and JSON.

use std::fmt::Write;

use super::measure::Row;

/// A markdown table, one row per point.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| point | params sketch / dense | FLOP ratio | fwd sketch ms | fwd tensor-ops ms | \
         fwd dense ms | fwd speedup | vs tensor-ops | fwd+bwd sketch ms | fwd+bwd dense ms | \
         fwd+bwd speedup | possible |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} / {} | {:.4} | {:.3} | {:.3} | {:.3} | {:.1}× | {:.2}× | {:.3} | {:.3} | {:.1}× | {:.1}× |",
            row.point.id(),
            row.sketch_params,
            row.dense_params,
            row.flop_ratio,
            row.sketch_forward.median_ms,
            row.tensor_ops_forward.median_ms,
            row.dense_forward.median_ms,
            row.forward_speedup(),
            row.kernel_speedup(),
            row.sketch_train.median_ms,
            row.dense_train.median_ms,
            row.train_speedup(),
            row.possible_speedup(),
        );
    }
    out
}

/// CSV with one line per point; times are medians and quartiles in milliseconds.
pub fn csv(rows: &[Row]) -> String {
    let timings = [
        "sketch_forward",
        "tensor_ops_forward",
        "dense_forward",
        "sketch_train",
        "dense_train",
    ];
    let mut out = String::from(
        "backend,d_input,d_output,num_terms,low_rank,batch,sketch_params,dense_params,flop_ratio,\
         forward_bytes",
    );
    for name in timings {
        let _ = write!(out, ",{name}_median_ms,{name}_p25_ms,{name}_p75_ms");
    }
    out.push_str(",forward_speedup,kernel_speedup,train_speedup,possible_speedup\n");
    for row in rows {
        let p = row.point;
        let _ = write!(
            out,
            "{},{},{},{},{},{},{},{},{},{}",
            row.backend,
            p.d_input,
            p.d_output,
            p.num_terms,
            p.low_rank,
            p.batch,
            row.sketch_params,
            row.dense_params,
            row.flop_ratio,
            row.forward_bytes
        );
        for t in [
            row.sketch_forward,
            row.tensor_ops_forward,
            row.dense_forward,
            row.sketch_train,
            row.dense_train,
        ] {
            let _ = write!(out, ",{},{},{}", t.median_ms, t.p25_ms, t.p75_ms);
        }
        let _ = writeln!(
            out,
            ",{},{},{},{}",
            row.forward_speedup(),
            row.kernel_speedup(),
            row.train_speedup(),
            row.possible_speedup()
        );
    }
    out
}
