//! Budgets per identity for the views its subscriptions hold. A view lasts as
//! long as a subscription on it, and a subscription outlives its connection in
//! a parked session, so the connection caps alone do not bound what one
//! identity keeps in memory: this does, on the writer thread, which sees every
//! subscription live or parked.
//!
//! An identity is charged once for each distinct view behind its subscriptions
//! (several windows of one view, or one view subscribed twice, cost it once),
//! whoever else holds that view too: a shared view's full cost is charged to
//! each identity holding it. So no one's budget depends on what other
//! identities do (a budget that shrank when others left could not be enforced
//! at that moment), and sharing with a victim's view buys an attacker nothing.
//! The cost is estimated from the view's length when the identity comes to
//! hold it (`limits::view_cost_bytes`): measuring every view's heap after every
//! write would cost the writer more than the budget saves. Admins and writers
//! are not budgeted (the `owner` of their requests is `None`).

use std::collections::HashMap;
use std::sync::Arc;

use ordo_core::{CollectionId, ViewDef, WindowAnchor, WindowId};

use super::fanout::FanoutTarget;
use super::subscriptions::WindowChange;
use super::{SessionId, SubHandle, Writer};
use crate::error::{ApiError, ErrorCode};
use crate::limits;
use crate::metrics::{self, METRICS};

type SubKey = (SessionId, SubHandle);

/// What every budgeted identity holds.
#[derive(Default)]
pub(super) struct ViewBudgets {
    /// The view each budgeted subscription is charged for, and to whom.
    charges: HashMap<SubKey, Charge>,
    owners: HashMap<Arc<str>, OwnerViews>,
}

struct Charge {
    owner: Arc<str>,
    view: Arc<str>,
}

#[derive(Default)]
struct OwnerViews {
    views: HashMap<Arc<str>, HeldView>,
    bytes: usize,
}

struct HeldView {
    /// The owner's subscriptions on this view.
    holders: usize,
    bytes: usize,
}

/// A view an identity is to hold: its identity and its estimated bytes.
pub(super) struct ViewCost {
    key: Arc<str>,
    bytes: usize,
}

impl ViewCost {
    fn new(collection: CollectionId, def: &ViewDef, n_items: usize) -> ViewCost {
        ViewCost { key: view_key(collection, def), bytes: limits::view_cost_bytes(n_items) }
    }
}

/// Equal definitions on one collection share one engine view (`Engine::find_or_create_view`),
/// so this names the view.
fn view_key(collection: CollectionId, def: &ViewDef) -> Arc<str> {
    Arc::from(format!("{}.{}|{def:?}", collection.index(), collection.generation()))
}

impl ViewBudgets {
    /// Whether `owner` may hold `cost` besides what it holds (instead of the view
    /// of `replacing`, when that subscription is the owner's only one on it).
    fn check(&self, owner: &str, cost: &ViewCost, replacing: Option<SubKey>) -> Result<(), ApiError> {
        let Some(usage) = self.owners.get(owner) else { return within(1, cost.bytes) };
        if usage.views.contains_key(&cost.key) {
            return Ok(());
        }
        let (mut n_views, mut bytes) = (usage.views.len() + 1, usage.bytes + cost.bytes);
        let replaced = replacing.and_then(|sub| self.charges.get(&sub)).and_then(|old| usage.views.get(&old.view));
        if let Some(held) = replaced.filter(|held| held.holders == 1) {
            n_views -= 1;
            bytes -= held.bytes;
        }
        within(n_views, bytes)
    }

    /// Charges `cost` to `owner` for `sub` (releasing what `sub` held before).
    fn charge(&mut self, sub: SubKey, owner: Arc<str>, cost: ViewCost) {
        self.release(sub);
        let usage = self.owners.entry(owner.clone()).or_default();
        match usage.views.get_mut(&cost.key) {
            Some(held) => held.holders += 1,
            None => {
                usage.bytes += cost.bytes;
                usage.views.insert(cost.key.clone(), HeldView { holders: 1, bytes: cost.bytes });
            }
        }
        self.charges.insert(sub, Charge { owner, view: cost.key });
    }

    /// Gives back what `sub` was charged, if anything: its view's cost when it was
    /// its owner's last subscription on that view.
    pub(super) fn release(&mut self, sub: SubKey) {
        let Some(charge) = self.charges.remove(&sub) else { return };
        let Some(usage) = self.owners.get_mut(&charge.owner) else { return };
        if let Some(held) = usage.views.get_mut(&charge.view) {
            held.holders -= 1;
            if held.holders == 0 {
                usage.bytes -= held.bytes;
                usage.views.remove(&charge.view);
            }
        }
        if usage.views.is_empty() {
            self.owners.remove(&charge.owner);
        }
    }

    /// The estimated view bytes of the identity holding the most.
    pub(super) fn largest_owner_bytes(&self) -> usize {
        self.owners.values().map(|usage| usage.bytes).max().unwrap_or(0)
    }

    pub(super) fn n_owners(&self) -> usize {
        self.owners.len()
    }
}

/// `Ok` when an identity holding `n_views` views of `bytes` estimated bytes is within its budget.
fn within(n_views: usize, bytes: usize) -> Result<(), ApiError> {
    let message = if n_views > limits::MAX_VIEWS_PER_IDENTITY {
        format!(
            "this identity holds {} views already (max_views_per_identity), over all its connections and \
             the sessions held for its resume; unsubscribe from some first",
            limits::MAX_VIEWS_PER_IDENTITY
        )
    } else if bytes > limits::MAX_VIEW_BYTES_PER_IDENTITY {
        format!(
            "this view would take this identity's views to about {} MiB, past its budget of {} MiB \
             (max_view_bytes_per_identity), over all its connections and the sessions held for its resume; \
             unsubscribe from some or narrow the filter",
            bytes.div_ceil(1024 * 1024),
            limits::MAX_VIEW_BYTES_PER_IDENTITY / (1024 * 1024)
        )
    } else {
        return Ok(());
    };
    metrics::add(&METRICS.view_budget_refusals, 1);
    Err(ApiError::new(ErrorCode::LimitExceeded, message))
}

impl Writer {
    /// Charges a new subscription's view to `owner`. Refused past the budget;
    /// `window` is then closed if it was opened for this subscription alone
    /// (it has no subscriber yet).
    pub(super) fn charge_new_subscription(
        &mut self,
        sub: SubKey,
        owner: Option<Arc<str>>,
        window: WindowId,
        opened_now: bool,
    ) -> Result<(), ApiError> {
        let Some(owner) = owner else { return Ok(()) };
        let shared = &self.fanout.windows[&window];
        let cost = ViewCost::new(shared.collection, &shared.spec.def, self.database.view_len(window)?);
        if let Err(error) = self.view_budgets.check(&owner, &cost, None) {
            if opened_now {
                let shared = self.fanout.windows.remove(&window).expect("registered");
                if let Some(key) = shared.share_key {
                    self.fanout.windows_by_key.remove(&key);
                }
                let _ = self.database.close_window(window);
            }
            return Err(error);
        }
        self.view_budgets.charge(sub, owner, cost);
        Ok(())
    }

    /// A `set_view` of a budgeted subscription: the new view is built (or found)
    /// behind a window nobody sees, measured, and the change refused before
    /// anything moves if it would take `owner` past its budget; the change then
    /// finds that view ready. The old view's cost is given back with the change.
    pub(super) fn change_view_within_budget(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        def: ViewDef,
        owner: Arc<str>,
    ) -> Result<(), ApiError> {
        let window = self
            .fanout
            .sessions
            .get(&session)
            .and_then(|state| state.subs.get(&handle))
            .map(|sub| sub.window)
            .ok_or_else(|| ApiError::new(ErrorCode::UnknownSubscription, "no such subscription"))?;
        let collection = self.fanout.windows[&window].collection;
        self.fanout.target = FanoutTarget::Discard;
        let probe = self.database.open_window_at(collection, &def, WindowAnchor::Offset(0), 1, &mut self.fanout);
        self.fanout.target = FanoutTarget::Subscribers;
        let (probe, _) = probe?;
        let result = self.change_view_charged(session, handle, def, owner, probe, collection);
        let _ = self.database.close_window(probe);
        result
    }

    /// The budget check and the change of `change_view_within_budget`, with the
    /// new view open behind `probe`.
    fn change_view_charged(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        def: ViewDef,
        owner: Arc<str>,
        probe: WindowId,
        collection: CollectionId,
    ) -> Result<(), ApiError> {
        let cost = ViewCost::new(collection, &def, self.database.view_len(probe)?);
        self.view_budgets.check(&owner, &cost, Some((session, handle)))?;
        self.change_window(session, handle, WindowChange::View(def))?;
        self.view_budgets.charge((session, handle), owner, cost);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(key: &str, bytes: usize) -> ViewCost {
        ViewCost { key: Arc::from(key), bytes }
    }

    #[test]
    fn a_view_is_charged_once_per_owner_and_released_with_its_last_holder() {
        let mut budgets = ViewBudgets::default();
        let alice: Arc<str> = Arc::from("alice");
        budgets.charge((1, 1), alice.clone(), cost("v", 1000));
        budgets.charge((1, 2), alice.clone(), cost("v", 1000));
        budgets.charge((2, 1), Arc::from("bob"), cost("v", 1000));
        assert_eq!(budgets.largest_owner_bytes(), 1000);
        budgets.release((1, 1));
        assert_eq!(budgets.owners["alice"].bytes, 1000, "one holder left");
        budgets.release((1, 2));
        assert!(!budgets.owners.contains_key("alice"));
        assert_eq!(budgets.n_owners(), 1);
    }

    #[test]
    fn a_replaced_view_is_not_counted_besides_its_replacement() {
        let mut budgets = ViewBudgets::default();
        let big = limits::MAX_VIEW_BYTES_PER_IDENTITY * 3 / 4;
        budgets.charge((1, 1), Arc::from("alice"), cost("old", big));
        assert!(budgets.check("alice", &cost("new", big), None).is_err());
        assert!(budgets.check("alice", &cost("new", big), Some((1, 1))).is_ok());
        assert!(budgets.check("alice", &cost("old", big), None).is_ok(), "held already: costs nothing more");
        assert!(budgets.check("bob", &cost("new", big), None).is_ok());
    }
}
