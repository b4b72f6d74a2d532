//! One page of a listing: what the `*/list` handlers of the extensions (tasks, trajectory,
//! mail) answer as `{items, hasMore, nextCursor?}`, where the cursor is the id of the page's
//! last item; and the scan that builds such a page from the store a chunk at a time.

use std::future::Future;

use crate::router::error::RouterError;

/// A page of items, and where the next one starts.
#[derive(Debug)]
pub struct Page<T> {
    /// At most the limit.
    pub items: Vec<T>,
    /// Whether another matching item follows.
    pub has_more: bool,
    /// The last item's id when another follows.
    pub next_cursor: Option<String>,
}

/// The first `limit` items of `matching` (already filtered, in listing order); `id_of` names
/// an item for the cursor.
pub fn take_page<T>(
    matching: impl Iterator<Item = T>,
    limit: usize,
    id_of: impl Fn(&T) -> String,
) -> Page<T> {
    let mut items = Vec::new();
    let mut has_more = false;
    for item in matching {
        if items.len() == limit {
            has_more = true;
            break;
        }
        items.push(item);
    }
    let next_cursor = if has_more {
        items.last().map(&id_of)
    } else {
        None
    };
    Page {
        items,
        has_more,
        next_cursor,
    }
}

/// A listing read from the store a chunk at a time. `chunk(after)` reads the rows after `after`
/// and returns those the caller may see and the filter passes, the key of the last row it read
/// (`None` when it read none) and whether the store had no more. The scan stops as soon as one
/// item past `limit` is known (so `has_more` is exact) or the rows end.
///
/// # Errors
/// The first error of `chunk`.
pub async fn scan_page<T, K, F, Fut>(
    mut after: Option<K>,
    limit: usize,
    mut chunk: F,
    id_of: impl Fn(&T) -> String,
) -> Result<Page<T>, RouterError>
where
    F: FnMut(Option<K>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<K>, bool), RouterError>>,
{
    let mut items = Vec::new();
    loop {
        let (picked, last, end) = chunk(after).await?;
        items.extend(picked);
        if items.len() > limit || end || last.is_none() {
            break;
        }
        after = last;
    }
    Ok(take_page(items.into_iter(), limit, id_of))
}
