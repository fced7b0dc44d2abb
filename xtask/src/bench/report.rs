//! The suite's outputs: a markdown table, CSV and JSON.

use std::fmt::Write;

use super::measure::Row;
use crate::stats::MB;

/// A markdown table, one row per point. "possible" is the speedup the FLOP counts allow, or
/// with a device model the roofline bounds; "of bound" is the sketched forward's roofline
/// bound over its measured time.
pub fn markdown(rows: &[Row]) -> String {
    let roofline = rows.iter().any(|r| r.roofline.is_some());
    let mut out = String::from(
        "| point | params sketch / dense | FLOP ratio | fwd sketch ms | fwd tensor-ops ms | \
         fwd dense ms | fwd speedup | vs tensor-ops | fwd+bwd sketch ms | fwd+bwd dense ms | \
         fwd+bwd speedup | possible | peak MB fwd sketch / dense | peak MB fwd+bwd sketch / dense |",
    );
    out.push_str(if roofline { " of bound |\n" } else { "\n" });
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    out.push_str(if roofline { "---|\n" } else { "\n" });
    for row in rows {
        let m = row.memory;
        let _ = write!(
            out,
            "| {} | {} / {} | {:.4} | {:.3} | {:.3} | {:.3} | {:.1}× | {:.2}× | {:.3} | {:.3} | {:.1}× | {:.1}× | {:.1} / {:.1} | {:.1} / {:.1} |",
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
            m.sketch_forward as f64 / MB,
            m.dense_forward as f64 / MB,
            m.sketch_train as f64 / MB,
            m.dense_train as f64 / MB,
        );
        match row.roofline_efficiency() {
            Some(e) => {
                let _ = writeln!(out, " {:.0} % |", 100.0 * e);
            }
            None if roofline => out.push_str(" |\n"),
            None => out.push('\n'),
        }
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
        "backend,dtype,d_input,d_output,num_terms,low_rank,batch,sketch_params,dense_params,\
         flop_ratio,forward_bytes",
    );
    for name in timings {
        let _ = write!(out, ",{name}_median_ms,{name}_p25_ms,{name}_p75_ms");
    }
    out.push_str(
        ",forward_speedup,kernel_speedup,train_speedup,possible_speedup,\
         peak_bytes_sketch_forward,peak_bytes_dense_forward,peak_bytes_sketch_train,\
         peak_bytes_dense_train,roofline_sketch_forward_ms,roofline_dense_forward_ms\n",
    );
    for row in rows {
        let p = row.point;
        let _ = write!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{}",
            row.backend,
            format!("{:?}", row.dtype).to_lowercase(),
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
        let m = row.memory;
        let (roof_sketch, roof_dense) =
            row.roofline
                .as_ref()
                .map_or((String::new(), String::new()), |r| {
                    (
                        r.sketch_forward_ms.to_string(),
                        r.dense_forward_ms.to_string(),
                    )
                });
        let _ = writeln!(
            out,
            ",{},{},{},{},{},{},{},{},{roof_sketch},{roof_dense}",
            row.forward_speedup(),
            row.kernel_speedup(),
            row.train_speedup(),
            row.possible_speedup(),
            m.sketch_forward,
            m.dense_forward,
            m.sketch_train,
            m.dense_train,
        );
    }
    out
}
