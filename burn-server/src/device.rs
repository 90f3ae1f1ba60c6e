//! [`DtrDevice`]: the device of a [`Dtr`](crate::Dtr) backend. Each device value made
//! with [`DtrDevice::new`] owns one slot, hence one client, one DTR runtime and one
//! budget; the default device (slot 0) reads its settings from `REMAT_DTR_CONF`.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Mutex, OnceLock};

use burn_backend::backend::{Device, DeviceId, DeviceOps, DeviceSettings};
use burn_ir::BackendIr;
use burn_router::get_client;
use remat_dtr::{DtrConfig, HostBudget};

use crate::channel::DtrChannel;
use crate::client::DtrStats;
use crate::cost::CostModel;
use crate::error::{Error, Result};
use crate::swap::SwapFaults;

/// `DeviceId::type_id` of every DTR device (an arbitrary tag; clients are keyed by
/// the channel type as well, so it never meets another backend's ids).
const TYPE_ID: u16 = 0xD7;
/// Slots are `u16` device indices; slot 0 is the default device.
const MAX_SLOTS: usize = u16::MAX as usize;

/// Settings of one DTR device: the runtime config and how op costs are measured.
#[derive(Debug, Clone, PartialEq)]
pub struct DtrOptions {
    /// Budget, budget mode, policy, seed, host tier… (see
    /// [`remat_dtr::DtrConfig`]; its `swap` field turns the host tier on).
    pub config: DtrConfig,
    /// How the cost of each op is taken.
    pub cost: CostModel,
    /// Test hook: makes copies to or from the host tier fail on demand.
    pub swap_faults: Option<SwapFaults>,
}

impl DtrOptions {
    /// Options with `config` and the default cost model ([`CostModel::WallClock`]).
    pub fn new(config: DtrConfig) -> Self {
        Self {
            config,
            cost: CostModel::default(),
            swap_faults: None,
        }
    }

    /// Replace the cost model.
    pub fn with_cost_model(mut self, cost: CostModel) -> Self {
        self.cost = cost;
        self
    }

    /// Turn the host tier on (swap; see the crate doc, *Swap to host
    /// memory*): storages are swapped to host memory when their two copies cost less
    /// than recomputing them, and parameters, inputs and optimizer state
    /// between their uses. The copy bandwidth is the config's
    /// `swap_bandwidth` when set, else measured when the device starts (a
    /// round trip of 4 MiB through the same copies; see
    /// [`DtrDevice::swap_bandwidth`]). The same as `swap:on` in
    /// `REMAT_DTR_CONF`.
    pub fn with_swap(mut self) -> Self {
        self.config.swap.enabled = true;
        self
    }

    /// Turn the host tier on at `gbps` GB/s per direction, not measured
    /// (`swap:on,swap_bandwidth:<gbps>`). A bandwidth that is not a positive
    /// finite number makes the device fail with a config error naming
    /// `swap_bandwidth`.
    pub fn with_swap_bandwidth(mut self, gbps: f64) -> Self {
        self.config.swap.enabled = true;
        self.config.swap.bandwidth_gbps = Some(gbps);
        self
    }

    /// The most bytes the host tier may hold (`host_budget`; `None`:
    /// unbounded, the default).
    pub fn with_host_budget(mut self, budget: Option<HostBudget>) -> Self {
        self.config.swap.host_budget = budget;
        self
    }

    /// Install the test hook `faults` (keep a clone to arm it).
    pub fn with_swap_faults(mut self, faults: SwapFaults) -> Self {
        self.swap_faults = Some(faults);
        self
    }
}

struct SlotEntry {
    options: DtrOptions,
    /// The inner backend's device, type-erased (`B::Device`).
    inner: Box<dyn Any + Send + Sync>,
}

/// Slots 1.. (index = slot − 1); slot 0 is the default device, configured from the
/// environment.
static SLOTS: Mutex<Vec<SlotEntry>> = Mutex::new(Vec::new());
static ENV_CONFIG: OnceLock<Result<DtrConfig, remat_dtr::ConfigError>> = OnceLock::new();

fn lock_slots() -> std::sync::MutexGuard<'static, Vec<SlotEntry>> {
    // A panic while holding the lock leaves the vector valid: ignore poisoning.
    SLOTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The options of `slot` (slot 0: `REMAT_DTR_CONF`, read once).
pub(crate) fn options_of(slot: u16) -> Result<DtrOptions> {
    if slot == 0 {
        let config = ENV_CONFIG.get_or_init(DtrConfig::from_env).clone()?;
        return Ok(DtrOptions::new(config));
    }
    lock_slots()
        .get(slot as usize - 1)
        .map(|e| e.options.clone())
        .ok_or(Error::UnknownDevice(slot))
}

/// The device of [`Dtr<B>`](crate::Dtr): an inner backend device plus the slot of
/// its DTR runtime.
///
/// ```no_run
/// use remat_burn_server::{Dtr, DtrDevice};
/// use remat_dtr::{DtrConfig, HostBudget};
/// # fn run<B: burn_ir::BackendIr>(inner: B::Device) -> Result<(), remat_burn_server::Error> {
/// let device = DtrDevice::<B>::new(inner, DtrConfig::default().with_budget(64 << 20))?;
/// // Tensor::<Dtr<B>, 2>::zeros([8, 8], &device) …
/// println!("{}", device.stats());
/// # Ok(()) }
/// ```
pub struct DtrDevice<B: BackendIr> {
    inner: B::Device,
    slot: u16,
    _b: PhantomData<fn() -> B>,
}

impl<B: BackendIr> DtrDevice<B> {
    /// A new device over `inner` with its own DTR runtime configured by `config`.
    pub fn new(inner: B::Device, config: DtrConfig) -> Result<Self> {
        Self::with_options(inner, DtrOptions::new(config))
    }

    /// A new device over `inner` with its own runtime configured by
    /// `REMAT_DTR_CONF` (unset: unbounded).
    pub fn from_env(inner: B::Device) -> Result<Self> {
        Self::new(inner, DtrConfig::from_env()?)
    }

    /// A new device over `inner` with explicit options.
    pub fn with_options(inner: B::Device, options: DtrOptions) -> Result<Self> {
        let mut slots = lock_slots();
        if slots.len() >= MAX_SLOTS {
            return Err(Error::TooManyDevices { max: MAX_SLOTS });
        }
        slots.push(SlotEntry {
            options,
            inner: Box::new(inner.clone()),
        });
        let slot = slots.len() as u16;
        Ok(Self {
            inner,
            slot,
            _b: PhantomData,
        })
    }

    /// The inner backend's device.
    pub fn inner(&self) -> &B::Device {
        &self.inner
    }

    /// This device's slot (0: the default device).
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The options this device was made with.
    pub fn options(&self) -> Result<DtrOptions> {
        options_of(self.slot)
    }

    /// Counters and memory figures of this device's runtime.
    pub fn stats(&self) -> DtrStats {
        get_client::<DtrChannel<B>>(self).stats()
    }

    /// The host tier's copy bandwidth per direction in GB/s (configured, or
    /// measured when the device started), when swap is on; `None` when it is
    /// off.
    pub fn swap_bandwidth(&self) -> Option<f64> {
        get_client::<DtrChannel<B>>(self).swap_bandwidth()
    }

    /// Take the first error since the last take, typed. Failures do not stop
    /// the device: ops that do not read a failed tensor keep running (see
    /// [`Error`]); this is where the typed figures of a failure are read.
    pub fn take_error(&self) -> Option<Error> {
        get_client::<DtrChannel<B>>(self).take_error()
    }

    /// Keep `e` for the next sync and [`DtrDevice::take_error`] (a failure
    /// outside any op: a seal called where no error can be returned).
    pub(crate) fn report(&self, e: Error) {
        get_client::<DtrChannel<B>>(self).report(e)
    }

    /// Walk the runtime's records and check their invariants (for tests).
    pub fn check_invariants(&self) -> Result<()> {
        get_client::<DtrChannel<B>>(self).check_invariants()
    }

    /// Make every live tensor a root (see [`DtrClient::seal`](crate::DtrClient::seal)):
    /// call it between training steps.
    pub fn seal(&self) -> Result<usize> {
        get_client::<DtrChannel<B>>(self).seal()
    }

    /// Record every training step from the next boundary on, also without a
    /// budget, so that [`DtrDevice::min_feasible_budget`] can answer for an
    /// unbudgeted run (with a budget, steps are recorded anyway).
    pub fn record_iterations(&self) {
        get_client::<DtrChannel<B>>(self).record_iterations()
    }

    /// The smallest budget (bytes, in the device's budget mode) under which
    /// the last recorded step replays at a cost of at most `max_overhead` times
    /// its first computations: answered offline by simulating the step, no
    /// trial runs. Steps end with [`DtrDevice::end_iteration`] (`RemoteDtr::end_step` ends
    /// one after each optimizer step).
    pub fn min_feasible_budget(&self, max_overhead: f64) -> Result<u64> {
        get_client::<DtrChannel<B>>(self).min_feasible_budget(max_overhead)
    }

    /// Write the last recorded step to `path` as a trace in the DTR paper's
    /// format: its ops under their names with their measured costs, output
    /// sizes, views (`ALIAS`), releases, and the parameters and inputs as
    /// constants (see [`remat_dtr::Recording::to_trace`]). `remat replay`,
    /// `remat plan` and `remat advise` run on the file. Returns the trace
    /// written. Record first ([`DtrDevice::record_iterations`] without a
    /// budget), then end a step ([`DtrDevice::end_iteration`]).
    ///
    /// Errors: [`remat_dtr::Error::NotRecorded`] before a recorded step ends,
    /// [`remat_dtr::Error::TraceWrite`] naming a path that cannot be written.
    pub fn export_trace(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<remat_dtr::trace::Trace> {
        get_client::<DtrChannel<B>>(self).export_trace(path.as_ref())
    }

    /// End a training step (see [`DtrClient::end_iteration`](crate::DtrClient::end_iteration));
    /// [`RemoteDtr::end_step`](crate::RemoteDtr::end_step) calls it after each optimizer step, after the seal.
    pub fn end_iteration(&self) -> Result<remat_dtr::IterationReport> {
        get_client::<DtrChannel<B>>(self).end_iteration()
    }

    /// Evict every resident storage that can be evicted; returns how many were.
    pub fn evict_all(&self) -> Result<usize> {
        get_client::<DtrChannel<B>>(self).evict_all()
    }

    /// Wait for the inner device, then ask the inner backend to release the
    /// memory its pools cache (`Backend::memory_cleanup`: cubecl's
    /// `memory_cleanup` on CUDA; nothing on Flex). The `empty_cache()` of
    /// this backend.
    pub fn empty_cache(&self) -> Result<()> {
        B::sync(&self.inner).map_err(|e| Error::Inner(format!("sync before cleanup: {e:?}")))?;
        B::memory_cleanup(&self.inner);
        Ok(())
    }

    /// Calibrate the placement model to the real device: `outside` bytes are
    /// live on the device but not in the model (temporaries, padding, tensors
    /// of other code). Lowers the runtime's eviction threshold to
    /// `budget − outside` (never above a threshold set in the configuration),
    /// so that before each op the runtime evicts until the model plus the rest
    /// fit the budget. Without a budget it changes nothing.
    pub fn calibrate_to(&self, outside: u64) -> Result<DeviceMemory> {
        let client = get_client::<DtrChannel<B>>(self);
        let (live, budget, threshold) = client.model_figures();
        let configured = self.options()?.config.threshold;
        let mut m = DeviceMemory {
            model_live: live,
            budget,
            outside_model: Some(outside),
            threshold,
            ..DeviceMemory::default()
        };
        if let Some(b) = budget {
            let calibrated = b.saturating_sub(outside);
            let t = configured.map_or(calibrated, |c| c.min(calibrated));
            client.set_threshold(Some(t));
            m.threshold = Some(t);
        }
        Ok(m)
    }
}

/// The placement model and the device's pools side by side, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceMemory {
    /// Resident bytes in the runtime's model.
    pub model_live: u64,
    /// The budget, when there is one.
    pub budget: Option<u64>,
    /// The inner pools' bytes in use (`None` when not read).
    pub pool_used: Option<u64>,
    /// The inner pools' reserved bytes.
    pub pool_reserved: Option<u64>,
    /// Live device bytes the model does not count.
    pub outside_model: Option<u64>,
    /// The eviction threshold in force.
    pub threshold: Option<u64>,
}

impl<B: BackendIr> Clone for DtrDevice<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            slot: self.slot,
            _b: PhantomData,
        }
    }
}

impl<B: BackendIr> std::fmt::Debug for DtrDevice<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DtrDevice")
            .field("inner", &self.inner)
            .field("slot", &self.slot)
            .finish()
    }
}

impl<B: BackendIr> Default for DtrDevice<B> {
    fn default() -> Self {
        Self {
            inner: B::Device::default(),
            slot: 0,
            _b: PhantomData,
        }
    }
}

impl<B: BackendIr> PartialEq for DtrDevice<B> {
    fn eq(&self, other: &Self) -> bool {
        self.slot == other.slot
    }
}

impl<B: BackendIr> Eq for DtrDevice<B> {}

impl<B: BackendIr> Device for DtrDevice<B> {
    fn from_id(device_id: DeviceId) -> Self {
        let slot = device_id.index_id;
        let inner = if slot == 0 {
            None
        } else {
            lock_slots()
                .get(slot as usize - 1)
                .and_then(|e| e.inner.downcast_ref::<B::Device>().cloned())
        };
        Self {
            inner: inner.unwrap_or_default(),
            slot,
            _b: PhantomData,
        }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: TYPE_ID,
            index_id: self.slot,
        }
    }
}

impl<B: BackendIr> DeviceOps for DtrDevice<B> {
    /// The inner device's settings (dtypes): a DTR device computes in the
    /// inner backend's types.
    fn defaults(&self) -> DeviceSettings {
        self.inner.defaults()
    }
}
