//! "Did you mean": the known word closest to a misspelt one, as clap suggests for flags.

/// The candidate closest to `word` by edit distance (insertions, deletions, substitutions and
/// swaps of two neighbours; case, `-` and `_` aside), if it is close enough to be what was meant:
/// at most one edit for a word of up to four letters, two for longer ones; never `word` itself.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let given = word;
    let word = word.to_ascii_lowercase().replace('-', "_");
    let allowed = if word.chars().count() <= 4 { 1 } else { 2 };
    candidates
        .into_iter()
        .filter(|c| *c != given)
        .map(|c| (edit_distance(&word, c), c))
        .filter(|&(d, _)| d <= allowed)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Optimal string alignment distance: Levenshtein plus the swap of two neighbouring characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTIONS: [&str; 6] = ["cache_size", "block_size", "allow_other", "io_threads", "layout", "ro"];

    #[test]
    fn near_misses_find_the_option() {
        for (typo, meant) in [
            ("cache_sise", "cache_size"),
            ("cachesize", "cache_size"),
            ("Cache-Size", "cache_size"),
            ("alow_other", "allow_other"),
            ("blocksize", "block_size"),
            ("io_thread", "io_threads"),
            ("layuot", "layout"),
            ("rp", "ro"),
        ] {
            assert_eq!(closest(typo, OPTIONS), Some(meant), "{typo}");
        }
    }

    #[test]
    fn far_words_and_exact_ones_find_nothing() {
        for word in ["frobnicate", "size", "cache", "xy", "ro"] {
            assert_eq!(closest(word, OPTIONS), None, "{word}");
        }
        assert_eq!(edit_distance("abc", "acb"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
