//! A minimal aligned-column printer for terminal output (`inferno list`).
//!
//! Columns are separated by two spaces and padded to their widest cell, counted in chars;
//! the last column is not padded, so lines carry no trailing spaces and a long last cell
//! (an error message) does not widen the others.

/// Rows of cells under a header.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    right_aligned: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns as `(title, right_aligned)`; right-align numbers so their digits line up.
    pub fn new(columns: &[(&str, bool)]) -> Table {
        Table {
            header: columns.iter().map(|(t, _)| t.to_string()).collect(),
            right_aligned: columns.iter().map(|(_, r)| *r).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra cells are dropped.
    pub fn push(&mut self, mut row: Vec<String>) {
        row.resize(self.header.len(), String::new());
        self.rows.push(row);
    }

    /// The header line and every row, each ending in a newline.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| self.all_rows().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in self.all_rows() {
            let last = row.len().saturating_sub(1);
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                let pad = " ".repeat(widths[c] - cell.chars().count());
                if c > 0 {
                    line.push_str("  ");
                }
                if self.right_aligned[c] {
                    line.push_str(&pad);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if c < last {
                        line.push_str(&pad);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    fn all_rows(&self) -> impl Iterator<Item = &Vec<String>> {
        std::iter::once(&self.header).chain(self.rows.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&[("NAME", false), ("SIZE", true), ("NOTE", false)]);
        t.push(vec!["a".into(), "1.2 GB".into(), "ok".into()]);
        t.push(vec!["longer-name".into(), "12 B".into()]);
        t.push(vec!["é".into(), "3 B".into(), "a long last cell".into()]);
        let want = "\
NAME           SIZE  NOTE
a            1.2 GB  ok
longer-name    12 B
é               3 B  a long last cell
";
        assert_eq!(t.render(), want);
    }
}
