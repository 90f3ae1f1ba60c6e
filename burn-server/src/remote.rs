//! [`RemoteDtr`]: the client side. A stock Burn 0.22 `Device` on a DTR server,
//! and remat's calls (end of step, figures, the floor query) as burn-remote
//! custom ops, which travel in order with the op stream.

use std::fmt;

use burn_backend::ops::FloatTensorOps;
use burn_backend::{DType, Shape};
use burn_dispatch::DispatchDevice;
use burn_ir::{CustomOpIr, ScalarIr, TensorIr};
use burn_remote::{CustomOpClient, RemoteBackend, RemoteDevice};
use burn_tensor::remote::RemoteHost;
use burn_tensor::Device;

use crate::client::DtrStats;
use crate::error::{Error, Result};

/// A connection to a DTR server ([`crate::serve`], or the `remat-burn-server`
/// binary) from a stock Burn 0.22 program.
///
/// ```no_run
/// # fn run() -> remat_burn_server::Result<()> {
/// use remat_burn_server::RemoteDtr;
/// let remat = RemoteDtr::connect("ws://127.0.0.1:3000")?;
/// let device = remat.device().autodiff(); // train on it as on any device
/// // … each step: forward, backward, optimizer.step(…), then:
/// remat.end_step();
/// println!("{}", remat.stats()?);
/// # Ok(()) }
/// ```
pub struct RemoteDtr {
    device: Device,
    client: CustomOpClient,
}

impl fmt::Debug for RemoteDtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteDtr")
            .field("device", &self.device)
            .finish()
    }
}

impl RemoteDtr {
    /// Connect device 0 of the server at `url` (`ws://host:port`).
    ///
    /// Errors: [`Error::Connect`] when the server cannot be reached.
    pub fn connect(url: &str) -> Result<Self> {
        let device = Device::remote_options(&RemoteHost::websocket(url))
            .init()
            .map_err(|e| Error::Connect {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
        Self::new(&device)
    }

    /// remat's calls on `device`, a remote device already connected (with or
    /// without autodiff).
    ///
    /// Errors: [`Error::NotRemote`] when `device` is not a remote device.
    pub fn new(device: &Device) -> Result<Self> {
        let plain = device.clone().inner();
        let remote: RemoteDevice = match plain.as_dispatch() {
            DispatchDevice::Remote(r) => r.clone(),
            // Reachable once any other backend feature of burn is on (a
            // user's `burn` with `flex`, …), which this crate does not turn on.
            #[allow(unreachable_patterns)]
            other => return Err(Error::NotRemote(format!("{other:?}"))),
        };
        Ok(Self {
            client: CustomOpClient::new(&remote),
            device: plain,
        })
    }

    /// The remote device, without autodiff (`.autodiff()` to train on it).
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// End a training step: the server seals the device (every live tensor,
    /// parameters and optimizer state included, becomes a root) and ends the
    /// runtime's iteration, from which the next steps are planned. Call it
    /// after each optimizer step. It is queued with the ops, so it costs no
    /// round trip; a failure is reported by the next `Device::sync` and
    /// counted in [`RemoteDtr::stats`].
    pub fn end_step(&self) {
        let outputs = self.client.register(CustomOpIr::new(END_STEP, &[], &[]));
        debug_assert!(outputs.is_empty());
    }

    /// The server device's figures (one round trip, and one upload of
    /// `STATS_LEN` `f64`s on the device: ask between steps).
    ///
    /// Errors: [`Error::Remote`] when the figures cannot be read.
    pub fn stats(&self) -> Result<RemoteStats> {
        let values = self.call(STATS, STATS_LEN, Vec::new())?;
        RemoteStats::from_values(&values)
    }

    /// The smallest budget (bytes) under which the last recorded step replays
    /// at a cost of at most `max_overhead` times its first computations (the
    /// server's [`crate::DtrDevice::min_feasible_budget`]; steps are recorded
    /// under a budget, or from the step after one the server's
    /// `record_iterations` asked for).
    ///
    /// Errors: [`Error::Remote`] naming why the server could not answer
    /// (no step recorded yet, …).
    pub fn min_feasible_budget(&self, max_overhead: f64) -> Result<u64> {
        let values = self.call(FLOOR, 2, vec![ScalarIr::Float(max_overhead)])?;
        if values[1] == 1.0 {
            return Ok(values[0] as u64);
        }
        // The server kept the reason for the next sync.
        let reason = match self.device.sync() {
            Err(e) => e.to_string(),
            Ok(()) => "the server could not answer".to_string(),
        };
        Err(Error::Remote(reason))
    }

    /// Run the custom op `id` with `scalars`; read its `f64` output of `len`.
    fn call(&self, id: &'static str, len: usize, scalars: Vec<ScalarIr>) -> Result<Vec<f64>> {
        let out = TensorIr::uninit(
            self.client.create_empty_handle(),
            Shape::new([len]),
            DType::F64,
        );
        let op = CustomOpIr::with_scalars(id, &[], &[out], scalars);
        let Some(t) = self.client.register(op).pop() else {
            return Err(Error::Remote(format!("`{id}` returned no output")));
        };
        let data = burn_std::reader::try_read_sync(RemoteBackend::float_into_data(t))
            .ok_or_else(|| Error::Remote(format!("`{id}`: cannot read synchronously")))?
            .map_err(|e| Error::Remote(format!("`{id}`: {e}")))?;
        let values: Vec<f64> = data
            .try_into_vec()
            .map_err(|e| Error::Remote(format!("`{id}`: {e:?}")))?;
        if values.len() != len {
            return Err(Error::Remote(format!(
                "`{id}` returned {} values, not {len} (a server of another version?)",
                values.len()
            )));
        }
        Ok(values)
    }
}

/// The custom op that ends a training step: seal the device, end the
/// runtime's iteration (no inputs, no outputs).
pub(crate) const END_STEP: &str = "remat.end_step";
/// The custom op that reports the device's figures: one `f64` output of
/// `STATS_LEN` values (see [`crate::RemoteStats`]).
pub(crate) const STATS: &str = "remat.stats";
/// The custom op that answers the floor query: one scalar input (the most
/// overhead), one `f64` output of 2 values (`[bytes, 1]`, or `[0, 0]` when
/// it could not be answered; the reason is kept for the next sync).
pub(crate) const FLOOR: &str = "remat.floor";

/// Number of `f64`s the stats op returns.
pub(crate) const STATS_LEN: usize = 20;

/// The server device's figures, as [`RemoteDtr::stats`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RemoteStats {
    /// Ops run (first executions, not replays).
    pub ops: u64,
    /// View ops recorded as aliases.
    pub views: u64,
    /// Uploads (parameters, inputs: never evicted).
    pub uploads: u64,
    /// Evictions.
    pub evictions: u64,
    /// Rematerializations (replays).
    pub rematerializations: u64,
    /// First computations (ns).
    pub compute_ns: f64,
    /// Replays (ns).
    pub remat_ns: f64,
    /// Bytes allocated in the placement model now.
    pub allocated: u64,
    /// Their peak.
    pub peak_allocated: u64,
    /// The budget (`None`: unbounded).
    pub budget: Option<u64>,
    /// Live tensors.
    pub tensors: u64,
    /// Resident storages.
    pub resident: u64,
    /// Steps ended ([`RemoteDtr::end_step`]).
    pub steps: u64,
    /// Of the last step ended: its index (0 for the first).
    pub last_index: Option<u64>,
    /// The last step followed a plan.
    pub last_planned: bool,
    /// The last step's first computations (ns).
    pub last_compute_ns: f64,
    /// The last step's replays (ns).
    pub last_remat_ns: f64,
    /// Swap-outs to the host tier.
    pub swap_outs: u64,
    /// Swap-ins.
    pub swap_ins: u64,
}

impl RemoteStats {
    /// The last step's replay cost over its first computations (1.0 when it
    /// replayed nothing; `None` before a step ended).
    pub fn last_overhead(&self) -> Option<f64> {
        self.last_index?;
        let c = self.last_compute_ns.max(1.0);
        Some((c + self.last_remat_ns) / c)
    }

    fn from_values(v: &[f64]) -> Result<Self> {
        if v.len() != STATS_LEN || v[0] != STATS_VERSION {
            return Err(Error::Remote(
                "stats of another layout (a server of another version?)".into(),
            ));
        }
        let u = |i: usize| v[i] as u64;
        let opt = |i: usize| (v[i] >= 0.0).then(|| v[i] as u64);
        Ok(Self {
            ops: u(1),
            views: u(2),
            uploads: u(3),
            evictions: u(4),
            rematerializations: u(5),
            compute_ns: v[6],
            remat_ns: v[7],
            allocated: u(8),
            peak_allocated: u(9),
            budget: opt(10),
            tensors: u(11),
            resident: u(12),
            steps: u(13),
            last_index: opt(14),
            last_planned: v[15] == 1.0,
            last_compute_ns: v[16],
            last_remat_ns: v[17],
            swap_outs: u(18),
            swap_ins: u(19),
        })
    }
}

/// The layout's tag, value 0 of the stats vector.
const STATS_VERSION: f64 = 1.0;

/// `stats` as the stats op's `f64` values (integers below 2^53 are exact).
pub(crate) fn stats_values(s: &DtrStats) -> Vec<f64> {
    let r = &s.runtime;
    let last = s.last_iteration.as_ref();
    let v = vec![
        STATS_VERSION,
        s.ops as f64,
        s.views as f64,
        s.uploads as f64,
        r.evictions as f64,
        r.rematerializations as f64,
        r.compute_ns,
        r.remat_ns,
        s.memory.allocated as f64,
        s.memory.peak_allocated as f64,
        s.memory.capacity.map_or(-1.0, |b| b as f64),
        s.tensors as f64,
        s.resident as f64,
        r.iterations as f64,
        last.map_or(-1.0, |l| f64::from(l.index)),
        last.map_or(0.0, |l| f64::from(u8::from(l.planned))),
        last.map_or(0.0, |l| l.compute_ns),
        last.map_or(0.0, |l| l.remat_ns),
        r.swap_outs as f64,
        r.swap_ins as f64,
    ];
    debug_assert_eq!(v.len(), STATS_LEN);
    v
}

impl fmt::Display for RemoteStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ops {} (views {}, uploads {}), evictions {}, rematerializations {}, \
             peak allocated {} B",
            self.ops,
            self.views,
            self.uploads,
            self.evictions,
            self.rematerializations,
            self.peak_allocated
        )?;
        if let Some(b) = self.budget {
            write!(f, " of {b} B")?;
        }
        if self.swap_outs + self.swap_ins > 0 {
            write!(
                f,
                ", swap-outs {}, swap-ins {}",
                self.swap_outs, self.swap_ins
            )?;
        }
        write!(f, ", steps {}", self.steps)?;
        if let (Some(i), Some(o)) = (self.last_index, self.last_overhead()) {
            let how = if self.last_planned {
                "planned"
            } else {
                "online"
            };
            write!(f, ", last step {i} {how} at {o:.3}x")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_round_trip_through_the_f64_layout() {
        let mut s = DtrStats {
            ops: 12,
            views: 3,
            uploads: 4,
            tensors: 9,
            resident: 7,
            ..DtrStats::default()
        };
        s.runtime.evictions = 5;
        s.runtime.rematerializations = 6;
        s.runtime.iterations = 2;
        s.memory.peak_allocated = (1 << 40) + 1;
        s.memory.capacity = Some(1 << 20);
        let r = RemoteStats::from_values(&stats_values(&s)).expect("layout");
        assert_eq!((r.ops, r.views, r.uploads), (12, 3, 4));
        assert_eq!((r.evictions, r.rematerializations, r.steps), (5, 6, 2));
        assert_eq!(r.peak_allocated, (1 << 40) + 1);
        assert_eq!(r.budget, Some(1 << 20));
        assert_eq!(r.last_index, None);
        assert_eq!(r.last_overhead(), None);
    }

    #[test]
    fn another_layout_is_refused() {
        let mut v = stats_values(&DtrStats::default());
        v[0] = 2.0;
        assert!(matches!(
            RemoteStats::from_values(&v),
            Err(Error::Remote(_))
        ));
        assert!(RemoteStats::from_values(&v[..3]).is_err());
    }
}
