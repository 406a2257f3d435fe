package event

import "encoding/json"

// webhookBody is the webhook body of docs/contract.md section 2, fields in the documented
// order. The notifier posts it and the API's event feed serves it: one encoder, so the feed
// holds the receiver's bytes.
type webhookBody struct {
	ID           string        `json:"id"`
	Type         string        `json:"type"`
	OccurredAt   string        `json:"occurred_at"`
	Sensor       webhookSensor `json:"sensor"`
	Data         uint8         `json:"data"`
	PreviousData *uint8        `json:"previous_data"`
	Revision     int64         `json:"revision"`
}

type webhookSensor struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// WebhookBody is the webhook body of e for a sensor at address.
func WebhookBody(e Event, address string) ([]byte, error) {
	return json.Marshal(webhookBody{
		ID: e.ID, Type: "sensor." + e.Type,
		OccurredAt: e.OccurredAt.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		Sensor:     webhookSensor{ID: e.SensorID, Address: address},
		Data:       e.Data, PreviousData: e.PreviousData, Revision: e.Revision,
	})
}
