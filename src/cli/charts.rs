//! SVG charts of replay reports, drawn with plotters' SVG backend:
//! overhead against the budget ratio (one line per policy) and one run's memory
//! over its compute clock.

use plotters::prelude::*;
use remat_dtr::replay::{ReplayReport, ReplayStatus};
use remat_dtr::BudgetMode;

use super::tables::unique;

/// An error while drawing (plotters' drawing errors, as text).
type ChartResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Line colours, one per policy (matplotlib's tab10, which reads on white).
const PALETTE: [RGBColor; 9] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// The overhead axis ends here: the replayer's thrash limit. Runs that ended
/// `oom` or `thrash` are drawn on it with a cross.
const OVERHEAD_TOP: f64 = 2.0;

/// SVG: overhead against the budget ratio, one line per policy (remat's drawn
/// thicker), for one trace and budget mode.
pub fn overhead_chart(
    reports: &[ReplayReport],
    trace: &str,
    mode: BudgetMode,
) -> ChartResult<String> {
    let rs: Vec<&ReplayReport> = reports
        .iter()
        .filter(|r| r.trace == trace && r.budget_mode == mode && r.ratio.is_some())
        .collect();
    let policies = unique(rs.iter().map(|r| r.policy.clone()));
    let x_min = rs
        .iter()
        .filter_map(|r| r.ratio)
        .fold(1.0f64, f64::min)
        .min(0.1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 460)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{trace}: overhead vs budget ({} budget)", mode.name()),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(56)
            .build_cartesian_2d(x_min..1.0f64, 1.0f64..OVERHEAD_TOP + 0.05)?;
        chart
            .configure_mesh()
            .x_desc("budget / unbounded peak")
            .y_desc("overhead: (compute + recompute) / compute")
            .x_labels(10)
            .y_labels(11)
            .light_line_style(RGBColor(0xf2, 0xf2, 0xf2))
            .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
            .draw()?;
        for (i, policy) in policies.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let width = if policy == "remat" { 3 } else { 1 };
            let mut points: Vec<(f64, f64, bool)> = rs
                .iter()
                .filter(|r| &r.policy == policy)
                .map(|r| {
                    let ok = r.status == ReplayStatus::Ok;
                    let y = if ok {
                        r.overhead.min(OVERHEAD_TOP)
                    } else {
                        OVERHEAD_TOP
                    };
                    (r.ratio.unwrap_or(0.0), y, ok)
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let finished = points.iter().filter(|p| p.2).map(|&(x, y, _)| (x, y));
            chart
                .draw_series(LineSeries::new(finished.clone(), color.stroke_width(width)))?
                .label(policy.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
                });
            chart.draw_series(finished.map(|p| Circle::new(p, 3, color.filled())))?;
            chart.draw_series(
                (points.iter().filter(|p| !p.2))
                    .map(|&(x, y, _)| Cross::new((x, y), 4, color.stroke_width(2))),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0xbb, 0xbb, 0xbb))
            .draw()?;
        root.draw(&Text::new(
            "× on the top edge: oom or thrash",
            (70, 440),
            ("sans-serif", 12)
                .into_font()
                .color(&RGBColor(0x55, 0x55, 0x55)),
        ))?;
        root.present()?;
    }
    Ok(svg)
}

/// SVG: live and reserved bytes over the compute clock for one run (its report
/// made with `timeline_every`), with the budget as a dashed line.
pub fn timeline_chart(r: &ReplayReport) -> ChartResult<String> {
    const MB: f64 = 1e6;
    let t_max_ms = r.timeline.last().map_or(1.0, |p| p.clock_ns.max(1.0)) / 1e6;
    let y_max_mb = (r.timeline.iter())
        .map(|p| p.reserved_bytes.max(p.live_bytes))
        .max()
        .unwrap_or(1)
        .max(r.budget_bytes.unwrap_or(0))
        .max(1) as f64
        / MB;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 360)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{}: {} at ratio {} ({} budget), memory over compute time",
                    r.trace,
                    r.policy,
                    r.ratio.unwrap_or(0.0),
                    r.budget_mode.name()
                ),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..t_max_ms, 0.0..y_max_mb * 1.05)?;
        chart
            .configure_mesh()
            .x_desc("compute clock (ms)")
            .y_desc("MB")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(RGBColor(0xf2, 0xf2, 0xf2))
            .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
            .draw()?;
        let series = |bytes: fn(&remat_dtr::replay::TimelinePoint) -> u64| {
            (r.timeline.iter()).map(move |p| (p.clock_ns / 1e6, bytes(p) as f64 / MB))
        };
        let live = PALETTE[1];
        let reserved = RGBColor(0xff, 0x7f, 0x0e);
        chart
            .draw_series(LineSeries::new(
                series(|p| p.live_bytes),
                live.stroke_width(1),
            ))?
            .label("live")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], live));
        chart
            .draw_series(LineSeries::new(
                series(|p| p.reserved_bytes),
                reserved.stroke_width(1),
            ))?
            .label("reserved")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], reserved));
        if let Some(b) = r.budget_bytes {
            let red = PALETTE[0];
            let y = b as f64 / MB;
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, y), (t_max_ms, y)],
                    6,
                    4,
                    red.stroke_width(1),
                ))?
                .label("budget")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0xbb, 0xbb, 0xbb))
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}

/// SVG: the budget curve of `remat advise`: the first step's and the steady
/// step's overhead against the budget (as a fraction of the peak), the floor
/// as a dashed line with the budgets below it shaded, runs that ended `oom`
/// or `thrash` as crosses on the top edge.
pub fn advice_chart(a: &remat_dtr::replay::advise::Advice) -> ChartResult<String> {
    use remat_dtr::replay::advise::human_bytes as human;
    let peak = a.peak_bytes.max(1) as f64;
    let floor_ratio = a.floor_bytes.map(|f| f as f64 / peak);
    let lowest = (a.rows.iter().map(|r| r.ratio))
        .chain(floor_ratio)
        .fold(1.0f64, f64::min);
    // A little room left of the lowest budget, on a tenth.
    let x_min = ((lowest - 0.05) * 10.0).floor().max(0.0) / 10.0;
    let highest = (a.rows.iter())
        .flat_map(|r| [r.first_overhead, r.steady_overhead])
        .flatten()
        .fold(1.0f64, f64::max);
    let y_max = (highest.min(OVERHEAD_TOP * 2.0) * 1.1).max(1.25);
    let failed = |r: &&remat_dtr::replay::advise::AdviceRow| r.status != ReplayStatus::Ok;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{}: overhead vs budget ({} budget, peak {})",
                    a.trace,
                    a.budget_mode.name(),
                    human(a.peak_bytes)
                ),
                ("sans-serif", 18),
            )
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(x_min..1.0f64, 1.0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc(format!(
                "budget / unbudgeted peak ({} = 1.0)",
                human(a.peak_bytes)
            ))
            .y_desc("overhead: (compute + recompute) / compute")
            .x_labels(11)
            .y_labels(8)
            .x_label_formatter(&|x| format!("{x:.1}"))
            .y_label_formatter(&|y| format!("{y:.2}×"))
            .light_line_style(RGBColor(0xf2, 0xf2, 0xf2))
            .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
            .draw()?;
        if let Some(f) = floor_ratio {
            let grey = RGBColor(0x99, 0x99, 0x99);
            let shade = RGBColor(0xe8, 0xe8, 0xe8);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x_min, 1.0), (f.max(x_min), y_max)],
                    shade.filled(),
                )))?
                .label(format!(
                    "below the floor: does not train within {:.1}×",
                    a.max_overhead
                ))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 20, y + 5)], shade.filled())
                });
            chart
                .draw_series(DashedLineSeries::new(
                    [(f, 1.0), (f, y_max)],
                    6,
                    4,
                    grey.stroke_width(2),
                ))?
                .label(format!(
                    "floor: {} ({f:.2} of peak)",
                    human(a.floor_bytes.unwrap_or(0))
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2))
                });
        }
        let steady = PALETTE[1];
        let first = RGBColor(0xff, 0x7f, 0x0e);
        let line = |f: fn(&remat_dtr::replay::advise::AdviceRow) -> Option<f64>| {
            let mut v: Vec<(f64, f64)> = (a.rows.iter())
                .filter_map(|r| f(r).map(|o| (r.ratio, o.min(y_max))))
                .collect();
            v.sort_by(|p, q| p.0.total_cmp(&q.0));
            v
        };
        let first_pts = line(|r| r.first_overhead);
        chart
            .draw_series(LineSeries::new(first_pts.clone(), first.stroke_width(2)))?
            .label("first step (online)")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], first.stroke_width(2))
            });
        chart.draw_series(first_pts.iter().map(|&p| Circle::new(p, 3, first.filled())))?;
        let steady_pts = line(|r| r.steady_overhead);
        chart
            .draw_series(LineSeries::new(steady_pts.clone(), steady.stroke_width(3)))?
            .label("steady step (planned)")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], steady.stroke_width(3))
            });
        chart.draw_series(
            steady_pts
                .iter()
                .map(|&p| Circle::new(p, 4, steady.filled())),
        )?;
        let red = PALETTE[0];
        if a.rows.iter().any(|r| failed(&r)) {
            chart
                .draw_series(
                    (a.rows.iter().filter(failed))
                        .map(|r| Cross::new((r.ratio, y_max), 5, red.stroke_width(2))),
                )?
                .label("did not train (oom / thrash)")
                .legend(move |(x, y)| Cross::new((x + 10, y), 5, red.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(0xbb, 0xbb, 0xbb))
            .label_font(("sans-serif", 13))
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}
