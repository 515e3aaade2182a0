// Drives the Arrow Flight SQL JDBC driver against a flightsrv server, the way BI tools do,
// and prints one JSON object per observation ({"k": key, "v": value}) for
// tests/test_server_jdbc.py to assert on. Usage: FlightJdbcCheck URL SUITE...
// Suites: metadata, query, prepared, context_params, update, dml_params, errors, login.
import java.math.BigDecimal;
import java.sql.*;
import java.util.*;

public class FlightJdbcCheck {
    static String json(Object o) {
        if (o == null) return "null";
        if (o instanceof Number || o instanceof Boolean) return o.toString();
        if (o instanceof List) {
            StringBuilder b = new StringBuilder("[");
            for (Object x : (List<?>) o) { if (b.length() > 1) b.append(','); b.append(json(x)); }
            return b.append(']').toString();
        }
        String s = o.toString();
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    static void out(String key, Object value) {
        System.out.println("{\"k\":" + json(key) + ",\"v\":" + json(value) + "}");
    }

    static List<List<Object>> rows(ResultSet rs, String... cols) throws SQLException {
        List<List<Object>> all = new ArrayList<>();
        while (rs.next()) {
            List<Object> row = new ArrayList<>();
            for (String c : cols) {
                Object v = rs.getObject(c);
                row.add(v == null ? null : (v instanceof Number || v instanceof Boolean) ? v : v.toString());
            }
            all.add(row);
        }
        rs.close();
        return all;
    }

    public static void main(String[] args) throws Exception {
        String url = args[0];
        Properties props = new Properties();
        for (int i = 2; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            if (kv.length == 2) props.setProperty(kv[0], kv[1]);
        }
        String suite = args[1];
        if (suite.equals("login")) {
            try (Connection c = DriverManager.getConnection(url, props);
                 Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT 41 + 1 AS x")) {
                rs.next();
                out("login", rs.getLong(1));
            } catch (SQLException e) {
                out("login_error", e.getMessage());
            }
            return;
        }
        try (Connection c = DriverManager.getConnection(url, props)) {
            switch (suite) {
                case "metadata": metadata(c); break;
                case "query": query(c); break;
                case "prepared": prepared(c); break;
                case "context_params": contextParams(c); break;
                case "update": update(c); break;
                case "dml_params": dmlParams(c); break;
                case "errors": errors(c); break;
                default: throw new IllegalArgumentException(suite);
            }
        }
    }

    /** The messages a BI tool shows for statements that do not bind. */
    static void errors(Connection c) throws SQLException {
        String[][] cases = {{"column", "SELECT vv FROM t"}, {"table", "SELECT * FROM tt"}};
        for (String[] kv : cases) {
            try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery(kv[1])) {
                out(kv[0], "no error");
            } catch (SQLException e) {
                out(kv[0], e.getMessage());
            }
        }
    }

    static void metadata(Connection c) throws SQLException {
        DatabaseMetaData md = c.getMetaData();
        out("product", md.getDatabaseProductName());
        out("catalogs", rows(md.getCatalogs(), "TABLE_CAT"));
        out("schemas", rows(md.getSchemas(), "TABLE_SCHEM", "TABLE_CATALOG"));
        out("tables", rows(md.getTables(null, null, "%", new String[]{"TABLE"}), "TABLE_CAT", "TABLE_SCHEM", "TABLE_NAME", "TABLE_TYPE"));
        out("tables_view", rows(md.getTables(null, null, "%", new String[]{"VIEW"}), "TABLE_NAME"));
        out("tables_pattern", rows(md.getTables("flightsrv", "main", "ty%", null), "TABLE_NAME"));
        out("tables_upper", rows(md.getTables(null, null, "TYPES", null), "TABLE_NAME"));
        out("tables_upper_pattern", rows(md.getTables(null, null, "T_PE%", null), "TABLE_NAME"));
        out("columns_upper", rows(md.getColumns(null, null, "TYPES", "i32"), "COLUMN_NAME"));
        out("table_types", rows(md.getTableTypes(), "TABLE_TYPE"));
        out("columns", rows(md.getColumns(null, null, "types", "%"), "COLUMN_NAME", "DATA_TYPE", "TYPE_NAME", "ORDINAL_POSITION", "COLUMN_SIZE", "DECIMAL_DIGITS"));
        out("type_info", rows(md.getTypeInfo(), "TYPE_NAME", "DATA_TYPE"));
        out("primary_keys", rows(md.getPrimaryKeys(null, null, "types"), "COLUMN_NAME"));
        out("imported_keys", rows(md.getImportedKeys(null, null, "types"), "FKCOLUMN_NAME"));
        out("exported_keys", rows(md.getExportedKeys(null, null, "types"), "PKCOLUMN_NAME"));
        out("read_only", md.isReadOnly());
        out("transactions", md.supportsTransactions());
        out("keywords", md.getSQLKeywords().length() > 0);
        out("quote", md.getIdentifierQuoteString());
        out("outer_joins", Arrays.asList(md.supportsOuterJoins(), md.supportsLimitedOuterJoins(),
                                         md.supportsFullOuterJoins()));
        out("default_isolation", md.getDefaultTransactionIsolation());
        // every no-argument property a BI tool may read: none may throw
        List<String> failed = new ArrayList<>();
        for (java.lang.reflect.Method m : DatabaseMetaData.class.getMethods()) {
            Class<?> r = m.getReturnType();
            if (m.getParameterCount() != 0 || !(r == boolean.class || r == int.class || r == String.class)) {
                continue;
            }
            try {
                m.invoke(md);
            } catch (java.lang.reflect.InvocationTargetException e) {
                Throwable t = e.getCause();
                if (!(t instanceof java.sql.SQLFeatureNotSupportedException)) {
                    failed.add(m.getName() + ": " + t);
                }
            } catch (IllegalAccessException e) {
                failed.add(m.getName() + ": " + e);
            }
        }
        java.util.Collections.sort(failed);
        out("properties_failed", failed);
    }

    static void query(Connection c) throws SQLException {
        try (Statement s = c.createStatement();
             ResultSet rs = s.executeQuery("SELECT * FROM types ORDER BY i32")) {
            ResultSetMetaData m = rs.getMetaData();
            List<Object> types = new ArrayList<>();
            for (int i = 1; i <= m.getColumnCount(); i++) types.add(m.getColumnName(i) + ":" + m.getColumnType(i));
            out("result_types", types);
            List<Object> all = new ArrayList<>();
            while (rs.next()) {
                List<Object> row = new ArrayList<>();
                for (int i = 1; i <= m.getColumnCount(); i++) {
                    Object v;
                    try {
                        v = rs.getObject(i);
                    } catch (RuntimeException e) {
                        v = "getObject failed: " + e.getMessage() + "; getString: " + rs.getString(i);
                    }
                    row.add(v == null ? null : v.toString());
                }
                all.add(row);
            }
            out("rows", all);
        }
        // getObject(i) on TIMESTAMP WITH TIME ZONE fails in the driver; these carry the instant
        try (Statement s = c.createStatement();
             ResultSet rs = s.executeQuery("SELECT tstz FROM types ORDER BY i32")) {
            rs.next();
            out("tstz_offset", rs.getObject(1, java.time.OffsetDateTime.class).toString());
            out("tstz_instant", rs.getObject(1, java.time.Instant.class).toString());
            out("tstz_millis", rs.getTimestamp(1).getTime());
        }
        try (Statement s = c.createStatement();
             ResultSet rs = s.executeQuery("SELECT count(*) AS n, sum(id) AS total FROM t")) {
            rs.next();
            out("count", rs.getLong("n"));
            out("sum", rs.getLong("total"));
        }
    }

    static void prepared(Connection c) throws SQLException {
        String sql = "SELECT count(*) FROM types WHERE b = ? AND i32 = ? AND i64 = ? AND f64 > ? "
                + "AND s = ? AND d = ? AND ts < ? AND dec = ?";
        try (PreparedStatement p = c.prepareStatement(sql)) {
            p.setBoolean(1, true);
            p.setInt(2, 1);
            p.setLong(3, 10000000000L);
            p.setDouble(4, 1.0);
            p.setString(5, "one");
            p.setDate(6, java.sql.Date.valueOf("2026-01-02"));
            p.setTimestamp(7, java.sql.Timestamp.valueOf("2030-01-01 00:00:00"));
            p.setBigDecimal(8, new BigDecimal("1.25"));
            try (ResultSet rs = p.executeQuery()) {
                rs.next();
                out("prepared_count", rs.getLong(1));
            }
            p.setBoolean(1, false);
            p.setInt(2, 2);
            p.setLong(3, 20000000000L);
            p.setString(5, "two");
            p.setDate(6, java.sql.Date.valueOf("2026-01-03"));
            p.setBigDecimal(8, new BigDecimal("2.50"));
            try (ResultSet rs = p.executeQuery()) {
                rs.next();
                out("prepared_count_2", rs.getLong(1));
            }
        }
        try (PreparedStatement p = c.prepareStatement("SELECT s FROM types WHERE i32 = ?")) {
            p.setInt(1, 2);
            try (ResultSet rs = p.executeQuery()) {
                rs.next();
                out("prepared_string", rs.getString(1));
            }
        }
    }

    interface Binder { void bind(PreparedStatement p) throws SQLException; }

    static void bound(Connection c, String key, String sql, Binder binder) {
        try (PreparedStatement p = c.prepareStatement(sql)) {
            binder.bind(p);
            try (ResultSet rs = p.executeQuery()) {
                List<Object> all = new ArrayList<>();
                while (rs.next()) {
                    Object v = rs.getObject(1);
                    all.add(v == null ? null : (v instanceof Number || v instanceof Boolean) ? v : v.toString());
                }
                out(key, all);
            }
        } catch (SQLException | RuntimeException e) {
            out(key, "error: " + e.getMessage());
        }
    }

    /** Parameters whose type only their context gives (LIKE, LIMIT, CAST, functions). */
    static void contextParams(Connection c) {
        bound(c, "like", "SELECT count(*) FROM types WHERE s LIKE ?", p -> p.setString(1, "t%"));
        bound(c, "ilike", "SELECT count(*) FROM types WHERE s ILIKE ?", p -> p.setString(1, "O%"));
        bound(c, "not_like", "SELECT count(*) FROM types WHERE s NOT LIKE ?", p -> p.setString(1, "t%"));
        bound(c, "starts_with", "SELECT count(*) FROM types WHERE starts_with(s, ?)", p -> p.setString(1, "on"));
        bound(c, "limit_offset", "SELECT i32 FROM types ORDER BY i32 LIMIT ? OFFSET ?", p -> { p.setLong(1, 1); p.setLong(2, 1); });
        bound(c, "limit_int", "SELECT i32 FROM types ORDER BY i32 LIMIT ?", p -> p.setInt(1, 1));
        bound(c, "cast_varchar", "SELECT CAST(? AS VARCHAR)", p -> p.setString(1, "x"));
        bound(c, "cast_integer", "SELECT CAST(? AS INTEGER)", p -> p.setInt(1, 7));
        bound(c, "cast_date", "SELECT ?::DATE", p -> p.setDate(1, java.sql.Date.valueOf("2026-01-02")));
        bound(c, "lower", "SELECT lower(?)", p -> p.setString(1, "AB"));
        bound(c, "coalesce", "SELECT coalesce(CASE WHEN i32 = 1 THEN NULL ELSE s END, ?) FROM types ORDER BY i32", p -> p.setString(1, "none"));
        bound(c, "untyped", "SELECT ? AS v", p -> p.setString(1, "hi"));
        bound(c, "minus_interval", "SELECT count(*) FROM types WHERE ts > ? - INTERVAL 1 DAY",
              p -> p.setTimestamp(1, java.sql.Timestamp.valueOf("2026-01-03 12:00:00")));
        bound(c, "untyped_null", "SELECT ? AS v", p -> p.setNull(1, Types.VARCHAR));
    }

    /** Prepared writes whose parameters DuckDB leaves untyped (v + ?, a MERGE's source,
     *  INSERT ... SELECT ?): bound with the Java type of the column they go to. */
    static void dmlParams(Connection c) throws SQLException {
        try (Statement s = c.createStatement()) {
            s.executeUpdate("CREATE OR REPLACE TABLE jd (id INTEGER, amount DOUBLE, price DECIMAL(10,2))");
            s.executeUpdate("INSERT INTO jd VALUES (1, 10.0, 1.00)");
        }
        try (PreparedStatement p = c.prepareStatement("UPDATE jd SET amount = amount + ? WHERE id = ?")) {
            p.setDouble(1, 2.5);
            p.setInt(2, 1);
            out("add", p.executeUpdate());
        }
        String merge = "MERGE INTO jd USING (SELECT ? AS id, ? AS amount) s ON jd.id = s.id "
            + "WHEN MATCHED THEN UPDATE SET amount = s.amount "
            + "WHEN NOT MATCHED THEN INSERT (id, amount) VALUES (s.id, s.amount)";
        try (PreparedStatement p = c.prepareStatement(merge)) {
            p.setInt(1, 2);
            p.setDouble(2, 7.5);
            out("merge_insert", p.executeUpdate());
            p.setInt(1, 2);
            p.setDouble(2, 8.5);
            out("merge_update", p.executeUpdate());
        }
        try (PreparedStatement p = c.prepareStatement("INSERT INTO jd (id, price) SELECT ?, ?")) {
            p.setInt(1, 3);
            p.setBigDecimal(2, new BigDecimal("2.50"));
            out("insert_select", p.executeUpdate());
        }
        try (Statement s = c.createStatement();
             ResultSet rs = s.executeQuery("SELECT id, amount, CAST(price AS VARCHAR) AS price FROM jd ORDER BY id")) {
            out("rows", rows(rs, "id", "amount", "price"));
        }
        // one $1 over a TINYINT and a BIGINT column: the value must reach DuckDB whole (a
        // driver narrowing 300 to the TINYINT occurrence's type deletes row 44)
        try (Statement s = c.createStatement()) {
            s.executeUpdate("CREATE OR REPLACE TABLE jn (id BIGINT, small TINYINT)");
            s.executeUpdate("INSERT INTO jn VALUES (44, 1), (300, 2), (5000000000, 3)");
        }
        try (PreparedStatement p = c.prepareStatement(
                "DELETE FROM jn WHERE id IN (SELECT id FROM jn WHERE small = $1) OR id = $1")) {
            p.setLong(1, 300L);
            out("twice_delete", p.executeUpdate());
        }
        bound(c, "twice_query", "SELECT id FROM jn WHERE small = $1 OR id = $1",
              p -> p.setLong(1, 5000000000L));
        try (Statement s = c.createStatement();
             ResultSet rs = s.executeQuery("SELECT id FROM jn ORDER BY id")) {
            out("twice_rows", rows(rs, "id"));
        }
    }

    static void update(Connection c) throws SQLException {
        try (Statement s = c.createStatement()) {
            out("delete_count", s.executeUpdate("DELETE FROM t WHERE id < 5"));
            out("insert_count", s.executeUpdate("INSERT INTO t VALUES (1000, 'a'), (1001, 'b')"));
        }
        try (PreparedStatement p = c.prepareStatement("DELETE FROM t WHERE id = ?")) {
            p.setLong(1, 1000L);
            out("prepared_delete_count", p.executeUpdate());
        }
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT count(*) FROM t")) {
            rs.next();
            out("count_after", rs.getLong(1));
        }
    }
}
