//! Printing: Markdown tables in the layout of the study's, so a run's output can be pasted into
//! `benches/RESULTS.md` as it is, and the number formats the study uses.

use std::fmt::Write as _;

/// A Markdown table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Self {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (as many cells as headers).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let row: Vec<String> = cells.into_iter().map(Into::into).collect();
        debug_assert_eq!(row.len(), self.headers.len());
        self.rows.push(row);
    }

    /// The table as Markdown, columns padded so it also reads well in a terminal.
    pub fn render(&self) -> String {
        let width = |c: usize| {
            self.rows
                .iter()
                .map(|r| r[c].chars().count())
                .chain([self.headers[c].chars().count(), 3])
                .max()
                .unwrap_or(3)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (cell, w) in cells.iter().zip(&widths) {
                let pad = w - cell.chars().count();
                let _ = write!(s, " {cell}{} |", " ".repeat(pad));
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.headers);
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        out.push_str(&line(&rule));
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// `1297187` → `1,297,187`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Relative difference of `got` from `want` as a signed percentage, `+0.03%`.
pub fn delta_pct(got: f64, want: f64) -> String {
    if want == 0.0 {
        return if got == 0.0 {
            "±0".to_owned()
        } else {
            "n/a".to_owned()
        };
    }
    format!("{:+.3}%", (got - want) / want * 100.0)
}

/// Milliseconds with one decimal, as the study prints waits: `424.0 ms`.
pub fn ms(seconds: f64) -> String {
    format!("{:.1} ms", seconds * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_297_187), "1,297,187");
        assert_eq!(delta_pct(101.0, 100.0), "+1.000%");
        assert_eq!(delta_pct(0.0, 0.0), "±0");
        assert_eq!(ms(0.4240), "424.0 ms");
        let mut t = Table::new(["a", "bb"]);
        t.row(["1", "2"]);
        assert_eq!(t.render(), "| a   | bb  |\n| --- | --- |\n| 1   | 2   |\n");
    }
}
