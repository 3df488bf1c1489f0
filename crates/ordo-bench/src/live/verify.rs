//! Every client's list against a one-shot query of its window.

use std::borrow::Borrow;

use hyper::Method;

use super::http::HttpPool;
use super::subscriber::{preview, SubscriberOutcome};
use super::wire::QueryReply;
use super::Result;

/// Compares every subscriber's list with a one-shot query of its window;
/// returns the number of differing lists and the first difference.
pub async fn verify_lists<O: Borrow<SubscriberOutcome>>(
    pool: &mut HttpPool,
    outcomes: &[O],
    collection_of: impl Fn(usize) -> String,
    sort_field: &str,
    window_limit: usize,
) -> Result<(usize, Option<String>)> {
    let view_of = |index| (collection_of(index), None);
    verify_filtered_lists(pool, outcomes, view_of, sort_field, window_limit, None).await
}

/// `verify_lists` where subscriber `index` watches `view_of(index)`: a
/// collection and the filter (JSON) it sees it through, if any; `fields` is
/// the subscribers' projection (a JSON array), if not the default one.
pub async fn verify_filtered_lists<O: Borrow<SubscriberOutcome>>(
    pool: &mut HttpPool,
    outcomes: &[O],
    view_of: impl Fn(usize) -> (String, Option<String>),
    sort_field: &str,
    window_limit: usize,
    fields: Option<&str>,
) -> Result<(usize, Option<String>)> {
    // One query per distinct view (the leaderboard's subscribers share one).
    let mut collections: Vec<(String, Option<String>)> = (0..outcomes.len()).map(&view_of).collect();
    collections.sort_unstable();
    collections.dedup();
    let replies = pool
        .run_requests(
            collections.len(),
            |index| {
                let (collection, filter) = &collections[index];
                let filter = filter.as_ref().map_or(String::new(), |filter| format!(r#""filter":{filter},"#));
                let fields = fields.map_or(String::new(), |fields| format!(r#""fields":{fields},"#));
                let query = format!(
                    r#"{{{filter}{fields}"sort":[{{"field":"{sort_field}","dir":"desc"}}],"offset":0,"limit":{window_limit}}}"#
                );
                (Method::POST, format!("/v1/collections/{collection}/query"), query.into_bytes())
            },
            None,
        )
        .await?;
    let mut windows = Vec::with_capacity(replies.len());
    for ((collection, _), reply) in collections.iter().zip(&replies) {
        let parsed: QueryReply = serde_json::from_slice(reply)
            .map_err(|error| format!("query of {collection}: unparsable reply ({error}): {}", preview(reply)))?;
        windows.push(parsed.items);
    }
    let mut n_mismatches = 0;
    let mut first_mismatch = None;
    for (index, outcome) in outcomes.iter().enumerate() {
        let outcome: &SubscriberOutcome = outcome.borrow();
        let view = view_of(index);
        let position = collections.binary_search(&view).expect("every view was queried");
        let collection = match &view.1 {
            Some(filter) => format!("{} where {filter}", view.0),
            None => view.0,
        };
        let expected = &windows[position];
        if outcome.list != *expected {
            n_mismatches += 1;
            if first_mismatch.is_none() {
                let at = outcome.list.iter().zip(expected).position(|(ours, theirs)| ours != theirs);
                first_mismatch = Some(format!(
                    "{collection}: client has {} items, query {}; first difference at {at:?}: client {:?}, query {:?}",
                    outcome.list.len(),
                    expected.len(),
                    at.and_then(|at| outcome.list.get(at)),
                    at.and_then(|at| expected.get(at)),
                ));
            }
        }
    }
    Ok((n_mismatches, first_mismatch))
}
