-- Opening hours, Monday to Friday, and the year's fixed holidays.
INSERT INTO business_hours (weekday, opens, closes)
SELECT d, '09:00', '17:30' FROM generate_series(1, 5) AS d
ON CONFLICT (weekday) DO NOTHING;

INSERT INTO holidays (day, name)
VALUES ('2026-12-25', 'Christmas Day'), ('2027-01-01', 'New Year''s Day')
ON CONFLICT (day) DO NOTHING;
